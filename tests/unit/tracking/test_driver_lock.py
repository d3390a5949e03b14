"""A run folder's driver.lock: one driver at a time continues a run; a lock whose owner no longer
runs on this host is taken over, by exactly one of the claimers racing for it; any other lock is
refused, naming its owner."""

import errno
import fcntl
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from raysim.tracking.driver_lock import claim_run_folder, release_run_folder, this_driver

HOST = socket.gethostname()


def test_of_two_drivers_taking_one_run_folder_the_second_is_refused_naming_the_first(tmp_path):
    assert claim_run_folder(tmp_path) is None  # the first driver takes it
    held_by = claim_run_folder(tmp_path)  # the second (here: the same process) finds it taken
    assert held_by == f"{this_driver()} holds {tmp_path / 'driver.lock'}, and that process is running"
    release_run_folder(tmp_path)  # the first driver's run ends
    assert not (tmp_path / "driver.lock").exists()
    assert claim_run_folder(tmp_path) is None


def test_the_lock_names_its_owner_by_pid_host_and_start_time(tmp_path):
    claim_run_folder(tmp_path)
    owner = (tmp_path / "driver.lock").read_text()
    assert owner.startswith(f"pid {os.getpid()} on {HOST}, started 20") and owner.endswith(" UTC\n")


def _hold(run_dir: Path, results) -> None:
    results.put(claim_run_folder(run_dir))
    time.sleep(600)  # a driver's run, until it is killed


def test_a_lock_left_by_a_killed_driver_is_refused_while_it_runs_and_taken_over_once_killed(tmp_path):
    fork = multiprocessing.get_context("fork")  # starts in milliseconds, with raysim imported
    results = fork.Queue()
    holder = fork.Process(target=_hold, args=(tmp_path, results))
    holder.start()
    try:
        assert results.get(timeout=60) is None  # it holds the folder
        held_by = claim_run_folder(tmp_path)
        assert held_by is not None and held_by.startswith(f"pid {holder.pid} on {HOST}, started ")
        assert held_by.endswith("and that process is running")
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as a driver killed outright: no clean-up runs
        holder.join()
    assert f"pid {holder.pid} " in (tmp_path / "driver.lock").read_text()  # left behind
    assert claim_run_folder(tmp_path) is None
    assert (tmp_path / "driver.lock").read_text() == this_driver() + "\n"
    release_run_folder(tmp_path)
    assert not (tmp_path / "driver.lock").exists()


def test_a_pid_reused_by_another_process_does_not_keep_the_lock(tmp_path):
    """The parent of this process runs, but it is not the process that started in 2001."""
    (tmp_path / "driver.lock").write_text(f"pid {os.getppid()} on {HOST}, started 2001-01-01 00:00:00 UTC\n")
    assert claim_run_folder(tmp_path) is None


def test_a_lock_it_cannot_prove_stale_is_refused_naming_its_owner_and_the_fix(tmp_path):
    lock = tmp_path / "driver.lock"
    cases = {
        "pid 4242 on node-7\n": (
            f"pid 4242 on node-7 holds {lock}: a driver on another host; "
            "if none runs on node-7 any more, delete the file"
        ),
        f"pid {os.getppid()} on {HOST}\n": (  # an older lock: no start time, and that pid runs
            f"pid {os.getppid()} on {HOST} holds {lock}, and that process is running"
        ),
        "": f"{lock} names no owner yet: delete it if no driver runs there",
        "someone\n": f"{lock} names no owner raysim can check ('someone'): delete it if no driver runs there",
    }
    for owner, refusal in cases.items():
        lock.write_text(owner)
        assert claim_run_folder(tmp_path) == refusal
        release_run_folder(tmp_path)  # never another driver's lock
        assert lock.read_text() == owner


def _claim(run_dir: Path, start, results, finish) -> None:
    start.wait()
    results.put((os.getpid(), claim_run_folder(run_dir)))
    finish.wait()  # the winner runs until every claimer has decided, as a driver would


def test_of_claimers_racing_over_a_stale_lock_exactly_one_wins(tmp_path):
    """Four processes, released at once by a barrier, claim a lock whose owner has exited; ten times."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(finished.stdout)
    fork = multiprocessing.get_context("fork")
    for attempt in range(10):
        run_dir = tmp_path / f"run-{attempt}"
        run_dir.mkdir()
        (run_dir / "driver.lock").write_text(f"pid {dead_pid} on {HOST}, started 2001-01-01 00:00:00 UTC\n")
        start, results, finish = fork.Barrier(4), fork.Queue(), fork.Barrier(4)
        claimers = [fork.Process(target=_claim, args=(run_dir, start, results, finish)) for _ in range(4)]
        for claimer in claimers:
            claimer.start()
        outcomes = [results.get(timeout=60) for _ in claimers]
        for claimer in claimers:
            claimer.join(timeout=60)
        winners = [pid for pid, held_by in outcomes if held_by is None]
        assert len(winners) == 1, outcomes
        assert (run_dir / "driver.lock").read_text().startswith(f"pid {winners[0]} on {HOST}, started ")
        losers = [held_by for _, held_by in outcomes if held_by is not None]
        assert all(f"pid {winners[0]} on {HOST}" in held_by for held_by in losers), losers


def test_a_lock_that_cannot_be_locked_to_check_is_refused(tmp_path, monkeypatch):
    """Some network file systems have no flock: a lock there is never taken over unchecked."""
    (tmp_path / "driver.lock").write_text("pid 1 on elsewhere\n")

    def no_flock(file, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = tmp_path / "driver.lock"
    assert claim_run_folder(tmp_path) == (
        f"{lock} cannot be checked (No locks available): delete it if no driver runs there"
    )
