"""Fail fast and clean up (issue 8, item 3): an unreachable tracking server or Ray address fails in
seconds naming it; a driver killed with SIGKILL or SIGTERM leaves no Ray process and no RUNNING
MLflow run behind; Ray's and MLflow's start-up notices stay off the console.

The drivers run as ``python -m raysim run`` subprocesses, each with its own Ray temp folder
(RAY_TMPDIR) and MLflow store in one short folder: their processes are found by that folder, never
by name (other Rays may run on this machine).
"""

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from jobs import tiny_job
from raysim.cli.main import main
from raysim.config import ResourcesConfig
from raysim.engine.preflight import check_ray_address
from raysim.runtime import ray_session  # Ray set up its log handler outside capsys

REPO = Path(__file__).resolve().parents[3]
NOISE = (
    "Token authentication is enabled",  # Ray, at every ray.init
    "Started a local Ray instance",  # Ray, at INFO
    "Creating initial MLflow database tables",  # MLflow, on a new SQLite store
    "Updating database tables",
    "alembic",
)


def job_file(folder: Path, **sections) -> str:
    raw = {
        "name": "failfast",
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg"},
        "engine": {"num_rounds": 100_000, "cohort_size": 3},
        "evaluation": {"every": 1000},
        "resources": {"backend": "ray", "num_workers": 1, "cpus_per_worker": 1},
        "tracking": {"experiment": "failfast", "progress": False},
        **sections,
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def short_dir():
    """A folder with a short path: Ray's socket paths below RAY_TMPDIR must fit 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="rsff-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_driver(folder: Path, job: str, **env: str) -> subprocess.Popen:
    environment = os.environ | {
        "RAY_TMPDIR": str(folder),
        "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
        "PYTHONPATH": str(REPO),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "raysim", "run", job, "--output-dir", str(folder / "out")],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_statuses(folder: Path) -> list[str]:
    try:
        with sqlite3.connect(folder / "mlflow.db") as db:
            return [status for (status,) in db.execute("SELECT status FROM runs")]
    except sqlite3.Error:  # not created yet
        return []


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.25)
    raise AssertionError(f"{what} not within {timeout_s} s")


def processes_of(folder: Path) -> list[str]:
    """Processes (besides this one) that name ``folder`` in their command line or environment, or
    hold a file open in it: the driver's Ray node, its workers and agents, and the sentinels."""
    mark, found = str(folder), []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if (
                mark in " ".join(process.cmdline())
                or any(mark in value for value in process.environ().values())
                or any(f.path.startswith(mark) for f in process.open_files())
            ):
                found.append(f"{process.pid} {process.name()}")
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("server", ["refuses", "never answers"])
def test_an_unreachable_tracking_server_fails_in_seconds_naming_it(tmp_path, monkeypatch, capsys, server):
    """Before: 256 s (refused) and 1,213 s (never answers) until an MLflow traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = closed_port() if server == "refuses" else silent.getsockname()[1]
        uri = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        start = time.perf_counter()
        code = main(["run", job_file(tmp_path), "--output-dir", str(tmp_path / "out")])
        seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2 and seconds < 15
    assert f"the MLflow tracking server {uri}" in err and "Traceback" not in err


def test_an_unreachable_ray_address_fails_in_seconds_naming_it(tmp_path, monkeypatch, capsys):
    """Before: ray.init waited for good (killed after 617 s)."""
    monkeypatch.setattr(ray_session.ray, "is_initialized", lambda: False)  # as in a fresh driver
    address = f"127.0.0.1:{closed_port()}"
    start = time.perf_counter()
    code = main(["run", job_file(tmp_path), f"resources.address={address}", "tracking.enabled=false"])
    err = capsys.readouterr().err
    assert code == 2 and time.perf_counter() - start < 15
    assert f"the Ray cluster at {address} refused the connection" in err


def test_a_running_gcs_passes_the_ray_preflight(ray_local):
    check_ray_address(ray_local.get_runtime_context().gcs_address)


def test_the_drivers_sigterm_handler_survives_ray_init(monkeypatch):
    """Ray's core replaces it by one that dumps a stack trace and aborts the driver."""

    def ray_init(**kwargs):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def ours(signum, frame):
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        monkeypatch.setattr(ray_session.ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray_session, "start_local_ray", ray_init)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        ray_session.init_ray(ResourcesConfig())
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_while_ray_starts_reaches_the_drivers_handler(monkeypatch):
    """Ray's handlers, set by ``ray.init`` while it starts, exited with 15 and (the node's) 1."""

    def ray_init(**kwargs):
        ray_session.ray._private.utils.set_sigterm_handler(lambda signum, frame: sys.exit(1))  # Ray's node
        signal.raise_signal(signal.SIGTERM)

    def ours(signum, frame):
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        monkeypatch.setattr(ray_session.ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray_session, "start_local_ray", ray_init)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        with pytest.raises(SystemExit) as stop:
            ray_session.init_ray(ResourcesConfig())
        assert stop.value.code == 143 and signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_sigkilled_driver_leaves_no_ray_process_and_its_run_ends_killed(short_dir):
    """Ray ties its GCS, raylet and workers to the driver; the node's agents (60 s otherwise) and
    the MLflow run are the sentinels' (``raysim.runtime.sentinel``)."""
    driver = start_driver(short_dir, job_file(short_dir))
    try:
        wait_for(lambda: run_statuses(short_dir) == ["RUNNING"], 120, "the run (workers up)")
        time.sleep(1)  # training
        assert len(processes_of(short_dir)) >= 4  # GCS, raylet, a worker, the sentinels, ...
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        killed = time.monotonic()
        wait_for(lambda: not processes_of(short_dir), 30, "no process of the driver's Ray left")
        wait_for(lambda: run_statuses(short_dir) == ["KILLED"], 30, "the run ended KILLED")
        print(f"clean {time.monotonic() - killed:.1f} s after SIGKILL")
    finally:
        driver.kill()
        driver.communicate()


@pytest.mark.parametrize("backend", ["serial", pytest.param("ray", marks=pytest.mark.slow)])
def test_sigterm_ends_the_run_as_killed_through_its_own_clean_up(short_dir, backend):
    """The same ``finally`` on both backends (exit code 143 says the driver's handler ran, not the
    sentinel); with Ray, the workers, the node and the sentinels are gone too."""
    job = job_file(short_dir, resources={"backend": backend, "num_workers": 1, "cpus_per_worker": 1})
    driver = start_driver(short_dir, job)
    try:
        wait_for(lambda: run_statuses(short_dir) == ["RUNNING"], 120, "the run")
        time.sleep(1)
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=60)
        assert driver.returncode == 128 + signal.SIGTERM, err
        assert "Exception ignored" not in err and "Traceback" not in err, err
        assert run_statuses(short_dir) == ["KILLED"]
        wait_for(lambda: not processes_of(short_dir), 30, "no process of the run left")
    finally:
        driver.kill()
        driver.communicate()


@pytest.mark.slow
def test_sigterm_while_ray_starts_ends_the_driver_as_on_the_serial_backend(short_dir):
    """Before: Ray's own handlers, in place while ``ray.init`` ran (most of a run's start-up),
    ended the driver with exit code 15 or 1, never 143."""
    driver = start_driver(short_dir, job_file(short_dir))
    try:
        others = lambda: [p for p in processes_of(short_dir) if not p.startswith(f"{driver.pid} ")]  # noqa: E731
        wait_for(others, 120, "Ray's first process (ray.init under way)")
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=60)
        assert driver.returncode == 128 + signal.SIGTERM, err
        assert "Exception ignored" not in err and "Traceback" not in err, err
        assert run_statuses(short_dir) in ([], ["KILLED"])  # no MLflow run before the workers are up
        wait_for(lambda: not processes_of(short_dir), 30, "no process of the driver's Ray left")
    finally:
        driver.kill()
        driver.communicate()


def test_the_console_shows_raysims_output_and_warnings_not_start_up_notices(short_dir):
    """A complete run on Ray with a new SQLite store; a client that raises is a warning that still
    shows. Nothing of the run is left afterwards."""
    job = job_file(
        short_dir,
        algorithm={"name": "diverging_test", "failure": "raise", "every": 4},
        engine={"num_rounds": 2, "cohort_size": 10, "max_failed_clients": 5},
    )
    driver = start_driver(short_dir, job)
    out, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err
    assert "failed and was dropped" in err  # raysim's own warning
    assert "raysim runs (final round)" in out and "MLflow runs" in out
    for notice in NOISE:
        assert notice not in out + err, notice
    assert run_statuses(short_dir) == ["FINISHED"]
    wait_for(lambda: not processes_of(short_dir), 30, "no process of the run left")


def test_ctrl_c_ends_the_run_as_killed(tmp_path, monkeypatch):
    from raysim.engine import loop
    from raysim.tracking.tracker import MemoryTracker

    def interrupted(engine, state, bar=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "round_loop", interrupted)
    tracker = MemoryTracker()
    with pytest.raises(KeyboardInterrupt):
        loop.run(tiny_job(), tracker=tracker, output_dir=tmp_path)
    assert tracker.status == "KILLED"


def test_mlflow_start_up_notices_are_off_unless_debugging(monkeypatch):
    from raysim.cli.driver import quiet_startup

    for debug, preset, expected in [("", None, "WARNING"), ("1", None, None), ("", "DEBUG", "DEBUG")]:
        monkeypatch.setenv("RAYSIM_DEBUG", debug)
        if preset is None:
            monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", preset)
        quiet_startup()
        assert os.environ.get("MLFLOW_LOGGING_LEVEL") == expected
