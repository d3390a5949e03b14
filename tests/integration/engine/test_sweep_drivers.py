"""Who drives a sweep, and what its MLflow runs say (issue 29, items 3 and 6): a second driver of a
sweep is refused while the first holds it, so each cell runs once; a rerun after a driver that
was killed outright ends what that driver left RUNNING; a sweep run never stays RUNNING after its
driver's own failure. The cells run in this process (``run_cell_tasks`` replaced), without Ray."""

import dataclasses
import os
import socket
import subprocess

import pytest
import yaml
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raysim.config.cells import load_sweep
from raysim.config.sweep import DRIVER_TAG, KIND_TAG, SWEEP_KIND, SWEEP_TAG, parse_sweep
from raysim.errors import RaysimError, ResourceError
from raysim.sweep import sweep_runs
from raysim.sweep.sweep_runs import run_sweep
from raysim.tracking.driver_lock import DRIVER_LOCK
from raysim.tracking.tracker import MlflowTracker

CELLS = ["tiny_lr0.05_seed0", "tiny_lr0.1_seed0"]


@pytest.fixture
def uri(tmp_path, monkeypatch):
    """The sweep's store; its cells run here, one after another, as Ray would run them."""

    def in_process(tasks, resources, on_done, stopping):
        for task in tasks:
            on_done(task.name, task.run(None))

    monkeypatch.setattr(sweep_runs, "run_cell_tasks", in_process)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def sweep_file(tmp_path, uri):
    job = {
        "name": "tiny",
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        "engine": {"num_rounds": 1, "cohort_size": 3},
        "resources": {"backend": "serial", "num_workers": 1, "cpus_per_worker": 1},
        "tracking": {"experiment": "sweeps", "tracking_uri": uri, "log_checkpoint": False},
        "sweep": {"seeds": [0], "grid": {"algorithm.local.lr": [0.05, 0.1]}},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def cell_runs(uri):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweeps").experiment_id
    return [r for r in client.search_runs([experiment]) if "raysim.cell" in r.data.tags]


def dead_driver() -> str:
    """An owner line of a driver of this host that no longer runs."""
    child = subprocess.Popen(["true"])
    child.wait()
    return f"pid {child.pid} on {socket.gethostname()}, started 2026-01-01 00:00:00 UTC"


def test_a_second_driver_is_refused_while_the_first_holds_the_sweep_and_each_cell_runs_once(
    tmp_path, uri, monkeypatch
):
    """Before, both drivers said "0 finished before, 2 to run" and every cell ran twice."""
    path, second = sweep_file(tmp_path, uri), []
    first_cell = sweep_runs.run_cell

    def run_cell_and_start_a_second_driver(*args, **kwargs):
        if not second:  # the first driver holds the sweep and runs its first cell
            second.append("started")
            try:
                second.append(run_sweep(load_sweep(path), tmp_path / "runs", lambda line: None))
            except RaysimError as exc:
                second.append(str(exc))
        return first_cell(*args, **kwargs)

    monkeypatch.setattr(sweep_runs, "run_cell", run_cell_and_start_a_second_driver)
    outcomes = run_sweep(load_sweep(path), tmp_path / "runs", lambda line: None)
    assert sorted(outcomes) == CELLS
    assert isinstance(second[1], str), f"the second driver ran {sorted(second[1])}"
    assert second[1].startswith("sweep tiny-") and f"pid {os.getpid()} on {socket.gethostname()}" in second[1]
    assert "let it finish (or stop it), then run the same command again" in second[1]
    runs = cell_runs(uri)
    assert sorted(r.data.tags["raysim.cell"] for r in runs) == CELLS  # one run per cell
    assert {r.info.status for r in runs} == {"FINISHED"}
    lines = []
    assert run_sweep(load_sweep(path), tmp_path / "runs", lines.append) == {}  # the lock was released
    assert "2 cells, 2 finished before, 0 to run" in lines[0]


def test_a_rerun_after_a_driver_killed_outright_ends_what_it_left_running_and_goes_on(tmp_path, uri):
    """A driver SIGKILLed whose sentinels died too (the machine rebooted) leaves its lock, its sweep
    run RUNNING and a cell run RUNNING; the rerun takes the lock over and ends both KILLED before
    going on (before, that cell run stayed RUNNING for good)."""
    sweep, dead = load_sweep(sweep_file(tmp_path, uri)), dead_driver()
    folder = tmp_path / "runs" / "sweeps" / sweep.id
    folder.mkdir(parents=True)
    (folder / DRIVER_LOCK).write_text(dead + "\n")
    client = MlflowClient(uri)
    experiment = MlflowTracker(sweep.jobs[CELLS[0]].tracking).experiment_id()
    tags = {KIND_TAG: SWEEP_KIND, SWEEP_TAG: sweep.id, DRIVER_TAG: dead}
    parent = client.create_run(experiment, run_name="tiny/sweep", tags=tags).info.run_id
    orphan_tags = {**sweep.cells[0].tags(sweep.id), "mlflow.parentRunId": parent}
    orphan = client.create_run(experiment, tags=orphan_tags).info.run_id
    lines = []
    outcomes = run_sweep(sweep, tmp_path / "runs", lines.append)
    assert lines[:2] == [
        f"sweep {sweep.id}: going on from {dead}, which no longer runs",
        f"sweep {sweep.id}: its MLflow run {parent} was left RUNNING by {dead}, which no longer runs: "
        "ended it KILLED, with 1 cell run(s)",
    ]
    assert client.get_run(orphan).info.status == "KILLED"
    assert {o.status for o in outcomes.values()} == {"FINISHED"} and len(outcomes) == 2
    assert client.get_run(parent).info.status == "FINISHED"
    assert client.get_run(parent).data.tags[DRIVER_TAG] != dead  # names the rerun's driver


def test_a_sweep_run_running_under_another_driver_is_refused_naming_it_and_the_fix(tmp_path, uri):
    """A driver with another --output-dir holds another lock; the sweep's run names it."""
    sweep = load_sweep(sweep_file(tmp_path, uri))
    client = MlflowClient(uri)
    experiment = MlflowTracker(sweep.jobs[CELLS[0]].tracking).experiment_id()
    other = "pid 4242 on node-7, started 2026-01-01 00:00:00 UTC"
    tags = {KIND_TAG: SWEEP_KIND, SWEEP_TAG: sweep.id, DRIVER_TAG: other}
    parent = client.create_run(experiment, run_name="tiny/sweep", tags=tags).info.run_id
    with pytest.raises(RaysimError) as refused:
        run_sweep(sweep, tmp_path / "runs", lambda line: None)
    assert str(refused.value) == (
        f"sweep {sweep.id}: its MLflow run {parent} is RUNNING under {other} (a driver with another "
        f"--output-dir, or on another host); let it finish, or if it no longer runs, end the run with "
        f"MlflowClient({uri!r}).set_terminated({parent!r}, 'KILLED') and run the same command again"
    )
    assert cell_runs(uri) == [] and client.get_run(parent).info.status == "RUNNING"
    assert not (tmp_path / "runs" / "sweeps" / sweep.id / DRIVER_LOCK).exists()  # released


def test_a_sweep_run_whose_params_mlflow_refuses_ends_failed_not_running(tmp_path, uri):
    """load_sweep refuses such a sweep (tests/unit/config/test_cells.py); should MLflow refuse a
    param all the same, the sweep run it began ends FAILED (before: RUNNING, and no cell run)."""
    sweep = load_sweep(sweep_file(tmp_path, uri))
    named = {"grid": {"dataset.partition": {"a/../evil": {"kind": "iid", "num_clients": 10}}}}
    with pytest.raises(MlflowException):
        run_sweep(dataclasses.replace(sweep, spec=parse_sweep(named)), tmp_path / "runs", lambda line: None)
    client = MlflowClient(uri)
    [parent] = client.search_runs([client.get_experiment_by_name("sweeps").experiment_id])
    assert parent.info.status == "FAILED"


def test_a_driver_that_fails_ends_its_sweep_run_failed_not_killed(tmp_path, uri, monkeypatch):
    def unfit(tasks, resources, on_done, stopping):
        raise ResourceError("2 sweep cell(s) do not fit any node")

    monkeypatch.setattr(sweep_runs, "run_cell_tasks", unfit)
    with pytest.raises(ResourceError):
        run_sweep(load_sweep(sweep_file(tmp_path, uri)), tmp_path / "runs", lambda line: None)
    client = MlflowClient(uri)
    [parent] = client.search_runs([client.get_experiment_by_name("sweeps").experiment_id])
    assert parent.info.status == "FAILED"
