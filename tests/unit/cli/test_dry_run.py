"""``raysim run --dry-run``'s summary: the workload, where results go, the notes, the start checks."""

import pytest

from raysim.cli import dry_run
from raysim.config import JobConfig
from raysim.errors import ConfigError


def job(name, **top):
    return JobConfig.from_dict(
        {
            "name": name,
            "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 6}},
            "model": {"name": "mlp", "hidden": [8]},
            "algorithm": {"name": "fedavg"},
            "engine": {"num_rounds": 3, "cohort_size": 2},
            "tracking": {"tracking_uri": "sqlite:///x.db", "experiment": "exp"},
            **top,
        }
    )


def test_the_summary_says_the_workload_where_results_go_and_each_note(monkeypatch):
    monkeypatch.setattr(dry_run, "check_start", lambda job: "skipped: not prepared")
    jobs = [job("a", note="scores 0.18 from a random start"), job("b", tracking={"experiment": "other"})]
    lines = dry_run.summary(jobs, "out")
    assert lines[0] == "dry run: 2 variants x 3 rounds x cohort 2 = 12 client trainings; nothing started"
    assert "  estimate  unknown until the dataset is prepared" in lines
    fedasync = {"asynchrony": {"kind": "fedasync", "concurrency": 2}}  # one client a server step
    asynchronous = job("c", engine={"num_rounds": 3, "cohort_size": 2, **fedasync}, system={})
    assert dry_run.summary([asynchronous], "out")[0].startswith(
        "dry run: 1 variant x 3 rounds x cohort 1 = 3 "
    )
    assert "  results   run folders under out/runs/" in lines
    assert "  results   MLflow sqlite:///x.db, experiment 'exp'" in lines
    assert any(line.startswith("  results   MLflow") and "'other'" in line for line in lines)
    assert "  checks    skipped: not prepared" in lines
    assert "  note      a: scores 0.18 from a random start" in lines


def test_the_summary_raises_what_the_runs_start_would():
    """Before, the dry run never built the model: FedBN on a model without BatchNorm passed."""
    from raysim.data.prepare import prepare_store

    fedbn = job("a", algorithm={"name": "fedbn"})
    prepare_store("digits", fedbn.dataset.config)
    with pytest.raises(ConfigError, match="fedbn keeps BatchNorm layers local"):
        dry_run.summary([fedbn], "out")


def test_the_estimate_line_names_its_parts(monkeypatch):
    from raysim.bench.calibration import Costs, Estimate

    costs = Costs(0.0124, 0.0006, 0.0031)
    estimate = Estimate(100.0, 20.0, 30.0, costs, steps=1000, examples=500, basis="mlp on a batch of 10x64")
    monkeypatch.setattr(dry_run, "check_start", lambda job: object())  # a prepared store
    monkeypatch.setattr(dry_run, "estimate_run", lambda job, store, home: estimate)
    [line] = [line for line in dry_run.summary([job("a"), job("b")], "out") if "estimate" in line]
    assert line.startswith(
        "  estimate  ~5 min on this machine, one after another (rough: training 3 min, evaluation "
        "40 s, overhead 60 s; 12.4 ms a local step of mlp on a batch of 10x64, 0.6 ms an evaluated "
        "example, 3.1 ms a client's work outside its steps; raysim.bench.calibration, cached in "
    )


def test_one_of_a_sweeps_axes_is_singular():
    """Before: "1 variants x 1 grid points x 1 seeds"."""
    from types import SimpleNamespace

    from raysim.config.sweep import parse_sweep

    spec = parse_sweep({"seeds": [0], "grid": {"algorithm.local.lr": [0.1]}})
    one = SimpleNamespace(spec=spec, cells=[SimpleNamespace(variant="a", seed=0)], total=1)
    assert dry_run.axes(one) == "1 variant x 1 grid point x 1 seed"
    two = SimpleNamespace(
        spec=spec, cells=[SimpleNamespace(variant=v, seed=s) for v in "ab" for s in (0, 1)], total=8
    )
    assert dry_run.axes(two) == "2 variants x 1 grid point x 2 seeds; 4 of 8 chosen"
