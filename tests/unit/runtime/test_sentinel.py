"""Sentinels act when their driver dies without a word, and never when it stands them down."""

import subprocess
import sys
import time

import psutil
import pytest

from raysim.runtime.sentinel import Sentinel

# A process titled like a Ray agent, holding a log file open in a session folder, until killed.
RAY_LIKE = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode())  # PR_SET_NAME: what ps and psutil show
log = open(sys.argv[2], "a")
print("ready", flush=True)
time.sleep(600)
"""


def ray_like(title: str, log_file) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", RAY_LIKE, title, str(log_file)], stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"ready\n"
    return process


def driver_dies(sentinel: Sentinel) -> None:
    """What the kernel does for a killed driver: its end of the pipe closes, nothing written."""
    sentinel.process.stdin.close()
    sentinel.process.wait(timeout=30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process titles via prctl")
def test_reap_ray_kills_the_sessions_ray_processes_and_nothing_else(tmp_path):
    session, elsewhere = tmp_path / "session_1", tmp_path / "other"
    session.mkdir()
    elsewhere.mkdir()
    agent = ray_like("ray::FakeAgent", session / "agent.log")
    other_session = ray_like("ray::FakeAgent", elsewhere / "agent.log")
    reader = ray_like("tail", session / "agent.log")  # e.g. someone reading the logs: not Ray's
    core = ray_like("fake_gcs", elsewhere / "gcs.log")  # a node process, known by pid and start
    start = psutil.Process(core.pid).create_time()
    try:
        driver_dies(Sentinel.start("reap-ray", str(session), f"{core.pid}:{start}"))
        assert agent.wait(timeout=10) == -9 and core.wait(timeout=10) == -9
        time.sleep(0.2)
        assert other_session.poll() is None and reader.poll() is None
    finally:
        for process in (agent, other_session, reader, core):
            process.kill()
            process.wait()


def test_a_sentinel_stood_down_does_nothing(tmp_path):
    session = tmp_path / "session_2"
    session.mkdir()
    agent = ray_like("ray::FakeAgent", session / "agent.log")
    try:
        sentinel = Sentinel.start("reap-ray", str(session))
        sentinel.stand_down()
        assert sentinel.process.returncode == 0
        time.sleep(0.2)
        assert agent.poll() is None
    finally:
        agent.kill()
        agent.wait()


def test_a_reused_pid_is_never_killed(tmp_path):
    bystander = ray_like("bystander", tmp_path / "x.log")
    try:
        driver_dies(Sentinel.start("reap-ray", str(tmp_path / "gone"), f"{bystander.pid}:12345.0"))
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/shm")
def test_unlink_segments_removes_a_dead_drivers_segments_and_no_other():
    from multiprocessing import shared_memory

    from raysim.runtime.shared_segments import segment_prefix

    prefix, other = segment_prefix(4_000_000_001), segment_prefix(4_000_000_002)
    mine = [shared_memory.SharedMemory(name=f"{prefix}{i}", create=True, size=64) for i in range(2)]
    theirs = shared_memory.SharedMemory(name=f"{other}0", create=True, size=64)
    try:
        driver_dies(Sentinel.start("unlink-segments", prefix))
        for memory in mine:
            with pytest.raises(FileNotFoundError):
                shared_memory.SharedMemory(name=memory.name)
        shared_memory.SharedMemory(name=theirs.name).close()  # still there
    finally:
        for memory in [*mine, theirs]:
            memory.close()
            try:
                memory.unlink()
            except FileNotFoundError:  # unlinked by the sentinel: only the tracker's record is left
                from multiprocessing import resource_tracker

                resource_tracker.unregister(memory._name, "shared_memory")
