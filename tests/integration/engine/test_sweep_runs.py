"""A tiny sweep on Ray (2 variants x 2 learning rates x 1 seed): the cells run concurrently, each
a child MLflow run of the sweep's run with the contract's tags; a failing variant does not stop
the rest; a rerun of the same sweep runs only the cells that did not finish."""

import pytest
import yaml
from mlflow.tracking import MlflowClient

from raysim.config.cells import load_sweep
from raysim.stop_request import clear_stop_request
from raysim.sweep.sweep_parent import SweepRun
from raysim.sweep.sweep_runs import run_cell, run_sweep


def sweep_file(tmp_path, uri):
    job = {
        "name": "tinysweep",
        "dataset": {
            "name": "digits",
            "partition": {"kind": "dirichlet", "num_clients": 20, "alpha": 0.5, "min_size": 20},
        },
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        "engine": {"num_rounds": 3, "cohort_size": 6},
        "evaluation": {"every": 1},
        "resources": {"backend": "serial", "num_workers": 1, "cpus_per_worker": 1},
        "tracking": {"experiment": "sweeps", "tracking_uri": uri, "log_checkpoint": False},
        "variants": [
            {"name": "fedavg"},
            {"name": "broken", "algorithm": {"name": "diverging_test", "failure": "raise", "every": 1}},
        ],
        "sweep": {"seeds": [0], "grid": {"algorithm.local.lr": [0.05, 0.1]}},
    }
    path = tmp_path / "tinysweep.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_cells_run_concurrently_as_tagged_child_runs_and_a_rerun_skips_finished_cells(ray_local, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = load_sweep(sweep_file(tmp_path, uri))
    outcomes = run_sweep(sweep, tmp_path / "runs", lambda line: None)

    assert {name: o.status for name, o in outcomes.items()} == {
        "fedavg_lr0.05_seed0": "FINISHED",
        "fedavg_lr0.1_seed0": "FINISHED",
        "broken_lr0.05_seed0": "FAILED",
        "broken_lr0.1_seed0": "FAILED",
    }
    assert "fails on purpose" in outcomes["broken_lr0.1_seed0"].error
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweeps").experiment_id
    [parent] = client.search_runs([experiment], "tags.`raysim.kind` = 'sweep'")
    assert parent.data.tags["raysim.sweep"] == sweep.id and parent.info.status == "FAILED"
    cells = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_cell = {run.data.tags["raysim.cell"]: run for run in cells}
    assert set(by_cell) == set(outcomes)
    for name, run in by_cell.items():
        assert run.info.status == outcomes[name].status and run.info.run_id == outcomes[name].run_id
        variant, lr = name.split("_")[0], name.split("_")[1].removeprefix("lr")
        tags = {k: v for k, v in run.data.tags.items() if k.startswith("raysim.") and k != "raysim.error"}
        assert tags == {
            "raysim.sweep": sweep.id,
            "raysim.cell": name,
            "raysim.axis.variant": variant,
            "raysim.axis.seed": "0",
            "raysim.axis.algorithm.local.lr": lr,
            "raysim.overrides": f"algorithm.local.lr={lr} seed=0",  # a cell is its axes as overrides
        }
        assert run.info.run_name == f"tinysweep/{variant} lr={lr} seed=0"
        assert ("fails on purpose" in run.data.tags["raysim.error"]) if variant == "broken" else (
            "raysim.error" not in run.data.tags)  # fmt: skip
    finished = [by_cell["fedavg_lr0.05_seed0"].info, by_cell["fedavg_lr0.1_seed0"].info]
    assert max(r.start_time for r in finished) < min(r.end_time for r in finished)  # they overlapped

    lines = []
    again = run_sweep(load_sweep(sweep_file(tmp_path, uri)), tmp_path / "runs", lines.append)
    assert set(again) == {"broken_lr0.05_seed0", "broken_lr0.1_seed0"}  # the finished cells are skipped
    assert lines[-1] == (  # a finished sweep names the command of its table
        f"its table: raysim report {sweep.id} --metric METRIC --columns algorithm.local.lr "
        f"--tracking-uri {uri}"
    )  # (no cell run now logged a metric: the broken ones fail first)
    [same] = client.search_runs([experiment], "tags.`raysim.kind` = 'sweep'")
    assert same.info.run_id == parent.info.run_id


@pytest.fixture
def opened():
    """Opens sweep runs as a driver does, and stands their sentinels down at the test's end."""
    parents = []

    def open_parent(sweep, job, *args):
        parents.append(SweepRun.open(sweep, job, *args))
        return parents[-1]

    yield open_parent
    for parent in parents:
        parent.sentinel.stand_down()


def cell_args(tmp_path, uri, opened, **changes):
    """``run_cell``'s arguments for one cell of the tiny sweep, run in this process."""
    sweep = load_sweep(sweep_file(tmp_path, uri), [f"{k}={v}" for k, v in changes.items()], ["fedavg"])
    cell = sweep.cells[0]
    parent = opened(sweep, sweep.jobs[cell.name])
    job = sweep.jobs[cell.name]
    return sweep, parent, (job.to_dict(), job.origin, cell.tags(sweep.id), parent.run_id, str(tmp_path))


@pytest.mark.parametrize("rule", ["median", "asha"])
def test_a_cell_the_stopping_rule_stops_ends_killed_tagged_and_counts_as_done(tmp_path, rule, opened):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep, parent, args = cell_args(tmp_path, uri, opened)
    reports = []

    def report(round_num, value):
        reports.append(round_num)
        return round_num == 1

    try:
        outcome = run_cell(*args, "eval/clients/accuracy", report, rule=rule)
    finally:
        clear_stop_request()
    assert outcome.status == "STOPPED" and reports == [0, 1]  # it stopped at the end of round 1
    run = MlflowClient(uri).get_run(outcome.run_id)
    assert run.info.status == "KILLED" and run.data.tags["raysim.stopped"] == rule
    assert run.data.tags["mlflow.parentRunId"] == parent.run_id
    assert parent.finished_cells() == {sweep.cells[0].name}


def test_a_cell_that_fails_before_its_run_starts_still_gets_a_failed_child_run(tmp_path, opened):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    changes = {"engine.schedule": str(tmp_path / "missing.json")}
    sweep, parent, args = cell_args(tmp_path, uri, opened, **changes)
    outcome = run_cell(*args, None, None)
    assert outcome.status == "FAILED" and "missing.json" in outcome.error
    run = MlflowClient(uri).get_run(outcome.run_id)
    assert run.info.status == "FAILED" and run.data.tags["mlflow.parentRunId"] == parent.run_id
    assert run.data.tags["raysim.cell"] == sweep.cells[0].name
    assert "missing.json" in run.data.tags["raysim.error"]
    assert parent.finished_cells() == set()


def test_an_untracked_sweep_notes_its_cells_and_a_rerun_skips_the_finished_ones(tmp_path, monkeypatch):
    """Without MLflow the driver keeps a ledger of outcomes; the cells run here in this process
    (run_cell_tasks replaced), the rerun runs only the failed cells."""
    import raysim.sweep.sweep_runs as sweep_runs

    def in_process(tasks, resources, on_done, stopping):
        for task in tasks:
            on_done(task.name, task.run(None))

    monkeypatch.setattr(sweep_runs, "run_cell_tasks", in_process)
    path = sweep_file(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    overrides = ["tracking.enabled=false", "engine.num_rounds=1"]
    lines = []
    first = run_sweep(load_sweep(path, overrides), tmp_path / "runs", lines.append)
    assert {n: o.status for n, o in first.items()} == {
        "fedavg_lr0.05_seed0": "FINISHED", "fedavg_lr0.1_seed0": "FINISHED",
        "broken_lr0.05_seed0": "FAILED", "broken_lr0.1_seed0": "FAILED",
    }  # fmt: skip
    ledger = next((tmp_path / "runs" / "sweeps").glob("tinysweep-*.jsonl"))
    assert lines[0].endswith(f"4 cells, 0 finished before, 4 to run (untracked: outcomes in {ledger})")
    again = run_sweep(load_sweep(path, overrides), tmp_path / "runs", lines.append)
    assert set(again) == {"broken_lr0.05_seed0", "broken_lr0.1_seed0"}  # the finished cells are skipped
    assert not (tmp_path / "mlflow.db").exists()
    assert not any("raysim report" in line for line in lines)  # report reads MLflow: untracked, no table
    everything = run_sweep(load_sweep(path, overrides), tmp_path / "runs", lines.append, rerun_finished=True)
    assert set(everything) == set(first)  # --rerun-finished


def test_a_stopped_sweep_ends_the_cell_runs_left_running_killed(tmp_path, opened):
    """A SIGTERM reaches the driver only: cells whose workers ended before their own clean-up
    leave RUNNING runs, which the driver ends KILLED (the sweep's own run is left to end())."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep, parent, _ = cell_args(tmp_path, uri, opened)
    client = MlflowClient(uri)
    experiment = parent.tracker.experiment_id()
    orphan = client.create_run(experiment, tags=sweep.cells[0].tags(sweep.id)).info.run_id
    other = client.create_run(experiment, tags={"raysim.sweep": "another-sweep"}).info.run_id
    assert parent.kill_running_cells() == 1
    assert client.get_run(orphan).info.status == "KILLED"
    assert client.get_run(other).info.status == "RUNNING"
    assert client.get_run(parent.run_id).info.status == "RUNNING"
