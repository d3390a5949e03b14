"""Sweep drivers as real processes (issue 29, items 3 and 6): a second driver of a running sweep is
refused, so each cell runs once; SIGTERM ends the running cells KILLED at once, also cells that
lose their interrupt; a SIGKILLed driver's sweep run ends KILLED (its sentinel) and a rerun goes on
from it.

Each driver is ``python -m raysim run`` with its own Ray temp folder (RAY_TMPDIR) and MLflow store
in one short folder, as in tests/integration/cluster/test_failfast.py.
"""

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from raysim.sweep.ray_cells import CANCEL_GRACE_S

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture
def short_dir():
    """A folder with a short path: Ray's socket paths below RAY_TMPDIR must fit 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="rssw-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def sweep_file(folder: Path, num_rounds: int, algorithm: str = "fedavg", **options) -> str:
    raw = {
        "name": "sigsweep",
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": algorithm, **options},
        "engine": {"num_rounds": num_rounds, "cohort_size": 3},
        "evaluation": {"every": 1000},
        "resources": {"backend": "serial", "num_workers": 1, "cpus_per_worker": 1},
        "tracking": {"experiment": "sweeps", "tracking_uri": f"sqlite:///{folder / 'mlflow.db'}"},
        "sweep": {"seeds": [0, 1]},
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def start_driver(folder: Path, job: str) -> subprocess.Popen:
    environment = os.environ | {"RAY_TMPDIR": str(folder), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "raysim", "run", job, "--output-dir", str(folder / "out")],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def statuses(folder: Path, kind: str) -> list[str]:
    """The statuses of the sweep's runs of one kind: "cell" or "sweep"."""
    key = "raysim.cell" if kind == "cell" else "raysim.kind"
    query = "SELECT r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid WHERE t.key = ?"
    try:
        with sqlite3.connect(folder / "mlflow.db") as db:
            return sorted(status for (status,) in db.execute(query, (key,)))
    except sqlite3.Error:  # not created yet
        return []


def last_cell_metric_s(folder: Path) -> float:
    """When a cell last logged a metric (seconds since the epoch, as the cells' clocks said)."""
    query = "SELECT MAX(m.timestamp) FROM metrics m JOIN tags t ON t.run_uuid = m.run_uuid WHERE t.key = ?"
    try:
        with sqlite3.connect(folder / "mlflow.db") as db:
            [(last,)] = list(db.execute(query, ("raysim.cell",)))
    except sqlite3.Error:  # locked for a write: ask again
        return 0.0
    return (last or 0) / 1000


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.25)
    raise AssertionError(f"{what} not within {timeout_s} s")


def read_line(driver: subprocess.Popen) -> str:
    assert driver.stdout is not None
    return driver.stdout.readline()


def test_a_second_driver_of_a_running_sweep_is_refused_and_each_cell_runs_once(short_dir):
    job = sweep_file(short_dir, num_rounds=5)
    first = start_driver(short_dir, job)
    try:
        assert "0 finished before, 2 to run" in read_line(first)  # it holds the sweep from here
        second = start_driver(short_dir, job)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2, out + err
        assert f"is run by another driver: pid {first.pid} on " in err and "run the same command again" in err
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
        assert statuses(short_dir, "cell") == ["FINISHED", "FINISHED"]  # one run per cell
    finally:
        first.kill()
        first.communicate()


def test_sigterm_ends_the_running_cells_killed_at_once_even_where_their_interrupt_is_lost(short_dir):
    """Ray cancels a running cell with one KeyboardInterrupt, which a cell can lose (in a class body
    of torch's lazy imports, early in a cell, or a library's broad ``except``): it trained on
    through the driver's whole grace (and could end FINISHED). The test plugin's clients lose it."""
    lossy = {"failure": "lost_interrupt", "every": 1}
    driver = start_driver(short_dir, sweep_file(short_dir, 100_000, "diverging_test", **lossy))
    try:
        wait_for(lambda: statuses(short_dir, "cell") == ["RUNNING", "RUNNING"], 180, "both cells running")
        wait_for(lambda: last_cell_metric_s(short_dir), 120, "the cells training")
        driver.send_signal(signal.SIGTERM)
        stopped = time.time()
        _, err = driver.communicate(timeout=CANCEL_GRACE_S + 60)
        assert driver.returncode == 128 + signal.SIGTERM, err
        assert "Exception ignored" not in err and "Traceback" not in err, err
        assert statuses(short_dir, "cell") == ["KILLED", "KILLED"]
        trained_on_s = last_cell_metric_s(short_dir) - stopped
        assert trained_on_s < 10, f"a cell logged rounds {trained_on_s:.0f} s after the sweep was stopped"
        assert statuses(short_dir, "sweep") == ["KILLED"]
    finally:
        driver.kill()
        driver.communicate()


def test_a_sigkilled_drivers_sweep_run_ends_killed_and_a_rerun_goes_on_from_it(short_dir):
    job = sweep_file(short_dir, num_rounds=100_000)
    driver = start_driver(short_dir, job)
    try:
        wait_for(lambda: statuses(short_dir, "cell") == ["RUNNING", "RUNNING"], 180, "both cells running")
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        wait_for(
            lambda: statuses(short_dir, "sweep") == ["KILLED"], 30, "the sweep run KILLED"
        )  # before: RUNNING
        wait_for(lambda: statuses(short_dir, "cell") == ["KILLED", "KILLED"], 30, "the cell runs KILLED")
    finally:
        driver.kill()
        driver.communicate()
    rerun = start_driver(short_dir, job)  # the killed driver's lock is stale: taken over
    try:
        assert f"going on from pid {driver.pid} on " in read_line(rerun)
        assert "2 cells, 0 finished before, 2 to run" in read_line(rerun)
        rerun.send_signal(signal.SIGTERM)
        _, err = rerun.communicate(timeout=CANCEL_GRACE_S - 15)
        assert rerun.returncode == 128 + signal.SIGTERM, err
    finally:
        rerun.kill()
        rerun.communicate()
