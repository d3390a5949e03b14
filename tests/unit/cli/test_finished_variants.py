"""Which variants of a job finished before: a rerun of ``raysim run`` skips exactly those whose
fingerprint (name and what they compute) has a FINISHED run in their experiment, or a FINISHED
line in the output folder's ledger when untracked. It used to run every variant again."""

from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from raysim.cli.finished_variants import (
    FINGERPRINT_TAG,
    finished_before,
    job_fingerprint,
    note_finished,
)
from raysim.config import load_jobs

JOB = {
    "name": "tiny",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "engine": {"num_rounds": 2, "cohort_size": 3},
    "tracking": {"enabled": False, "progress": False},
    "variants": [{"name": "a"}, {"name": "b", "algorithm": {"local": {"lr": 0.5}}}],
}


def jobs(tmp_path, *overrides, **changes):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    return load_jobs(path, list(overrides))


def finished(job, accuracy):
    """What ``run`` returns, as far as the ledger reads it."""
    return SimpleNamespace(job=job, final={"eval/central/accuracy": accuracy}, seconds=4.0)


def test_the_fingerprint_changes_with_what_a_variant_computes_only(tmp_path):
    a, b = jobs(tmp_path)
    assert job_fingerprint(a).startswith("a-") and job_fingerprint(a) != job_fingerprint(b)
    assert job_fingerprint(a) == job_fingerprint(jobs(tmp_path)[0])
    same = jobs(tmp_path, "resources.num_workers=3", "tracking.experiment=other")[0]
    assert job_fingerprint(same) == job_fingerprint(a)  # where and how it runs
    assert job_fingerprint(jobs(tmp_path, "note=read me")[0]) == job_fingerprint(a)  # words only
    for arithmetic in ("resources.precision=bf16", "resources.deterministic=true"):
        assert job_fingerprint(jobs(tmp_path, arithmetic)[0]) != job_fingerprint(a), arithmetic
    assert job_fingerprint(jobs(tmp_path, "a:engine.num_rounds=3")[0]) != job_fingerprint(a)
    assert job_fingerprint(jobs(tmp_path, name="other")[0]) != job_fingerprint(a)  # another job's


def test_untracked_variants_noted_finished_in_the_ledger_are_skipped(tmp_path):
    a, b = jobs(tmp_path)
    out = tmp_path / "out"
    assert finished_before([a, b], out, print) == {}
    note_finished(finished(a, 0.75), out)
    earlier = finished_before([a, b], out, print)
    assert list(earlier) == ["a"]
    assert earlier["a"].final == {"eval/central/accuracy": 0.75} and earlier["a"].seconds == 4.0
    changed = jobs(tmp_path, "a:algorithm.local.lr=0.2")
    assert finished_before(changed, out, print) == {}  # a changed: it runs again
    assert finished_before([a, b], tmp_path / "elsewhere", print) == {}  # the ledger is the folder's


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(uri)


def test_tracked_variants_with_a_finished_run_of_their_fingerprint_are_skipped(tmp_path, store):
    a, b = jobs(tmp_path, "tracking.enabled=true", "tracking.experiment=ex")
    experiment = store.create_experiment("ex")
    for job, status, accuracy in [(a, "FINISHED", 0.8), (b, "KILLED", 0.1)]:
        made = store.create_run(
            experiment, run_name=f"tiny/{job.name}", tags={FINGERPRINT_TAG: job_fingerprint(job)}
        )
        store.log_metric(made.info.run_id, "eval/central/accuracy", accuracy, step=1)
        store.set_terminated(made.info.run_id, status)
    earlier = finished_before([a, b], tmp_path / "out", print)
    assert list(earlier) == ["a"]  # b's run was killed: it runs again
    assert earlier["a"].name == "a" and earlier["a"].final["eval/central/accuracy"] == 0.8
    assert earlier["a"].run_id is not None and earlier["a"].rounds == 2  # from its history
    moved = jobs(tmp_path, "tracking.enabled=true", "tracking.experiment=other")
    assert finished_before(moved, tmp_path / "out", print) == {}  # another experiment's runs


@pytest.mark.parametrize("store", ["one_byte", "text", "ftp"])
def test_a_tracking_store_of_no_use_is_one_line_before_any_variant_reads_or_makes_it(
    store, tmp_path, capsys, monkeypatch
):
    """The variants' path read the store for finished variants, and opened each variant's
    tracker, before a run's own check: a 1-byte file became an MLflow database, a text file or
    ``ftp://`` a SQLAlchemy traceback."""
    from raysim.cli.main import main

    path = tmp_path / "mlflow.db"
    if store == "ftp":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://x")
        tracking = {"progress": False}
    else:
        path.write_bytes(b"x" if store == "one_byte" else b"not a database\n" * 200)
        tracking = {"progress": False, "tracking_uri": f"sqlite:///{path}"}
    before = path.read_bytes() if path.exists() else None
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**JOB, "tracking": tracking}))
    assert main(["run", str(job), "--output-dir", str(tmp_path / "out")]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and len(out.err.strip().splitlines()) == 1, out.err
    assert (path.read_bytes() if path.exists() else None) == before  # left as it was
    assert not (tmp_path / "out").exists()  # no run folder, no ledger
