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
