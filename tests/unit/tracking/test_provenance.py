"""Run names ``job/variant`` and the source tags: the command line and the job file's git state."""

import json
import subprocess
from pathlib import Path

import yaml

from raysim.config import JobConfig, load_jobs
from raysim.tracking.provenance import (
    command_line,
    git_tags,
    naming_tags,
    run_name,
    source_tags,
    submission_env,
)

REPO = Path(__file__).resolve().parents[3]

BASE = {
    "name": "study",
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def write(folder, raw, name="job.yaml"):
    path = folder / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_variant_is_named_job_slash_variant(tmp_path):
    path = write(tmp_path, {**BASE, "variants": [{"name": "avg"}, {"algorithm": {"name": "fedprox"}}]})
    avg, prox = load_jobs(path)
    assert (run_name(avg), run_name(prox)) == ("study/avg", "study/fedprox")
    assert naming_tags(avg) == {"job": "study", "variant": "avg"}
    assert avg.origin is not None and avg.origin.path == str(path.absolute())


def test_a_file_without_variants_or_name_is_named_by_its_stem(tmp_path):
    plain = {k: v for k, v in BASE.items() if k != "name"}
    [job] = load_jobs(write(tmp_path, plain, "quick.yaml"))
    assert run_name(job) == "quick" and naming_tags(job) == {"job": "quick"}
    [named] = load_jobs(write(tmp_path, BASE))
    assert run_name(named) == "study"


def test_tracking_run_name_wins_and_python_jobs_use_their_name(tmp_path):
    [job] = load_jobs(write(tmp_path, {**BASE, "variants": [{"name": "avg"}]}), ["tracking.run_name=mine"])
    assert run_name(job) == "mine"
    assert run_name(JobConfig.from_dict(BASE)) == "study" and JobConfig.from_dict(BASE).origin is None


def test_the_origin_is_not_part_of_the_config(tmp_path):
    [job] = load_jobs(write(tmp_path, BASE))
    assert "origin" not in job.to_dict()
    assert JobConfig.from_dict(job.to_dict()).to_dict() == job.to_dict()


def test_command_line_names_raysim_however_it_was_started():
    assert command_line(["/venv/bin/raysim", "run", "a b.yaml", "x=1"]) == "raysim run 'a b.yaml' x=1"
    assert command_line(["/src/raysim/__main__.py", "run", "j.yaml"]) == "raysim run j.yaml"
    assert command_line(["/venv/bin/pytest", "-q"]) == "/venv/bin/pytest -q"


def test_git_tags_name_the_job_repository_commit_and_a_dirty_tree(tmp_path):
    assert git_tags(tmp_path) == {}  # no repository
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    path = write(tmp_path, BASE)
    subprocess.run([*git, "add", "job.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "job"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    tags = git_tags(tmp_path)
    assert tags["mlflow.source.git.commit"] == head and tags["git_dirty"] == "false"
    assert tags["mlflow.source.git.branch"] == "main"
    assert tags["mlflow.source.git.repoURL"] == str(tmp_path.resolve())  # no remote: the folder
    path.write_text(path.read_text() + "seed: 2\n")
    [job] = load_jobs(path)
    assert source_tags(job, ["raysim", "run", str(path)])["git_dirty"] == "true"


def test_runs_that_differ_on_the_command_line_differ_in_name(tmp_path):
    path = write(tmp_path, {**BASE, "variants": [{"name": "avg"}]})

    def name(*overrides, extra=()):
        [job] = load_jobs(path, list(overrides))
        return run_name(job, extra)

    assert name() == "study/avg"
    assert name("engine.num_rounds=6") == "study/avg num_rounds=6"
    assert name("algorithm.name=fedprox", "algorithm.local.lr=0.1") == "study/avg algorithm=fedprox lr=0.1"
    # where and how a run goes does not change what it computes: not in the name
    assert name("resources.backend=serial", "tracking.tracking_uri=sqlite:///x.db") == "study/avg"
    assert name("seed=1", extra=["lr=0.03"]) == "study/avg seed=1 lr=0.03"  # a sweep cell's axes
    assert name("tracking.tags={a: " + "x" * 40 + "}") == "study/avg"
    assert name("algorithm.local.lr=0." + "1" * 60) == "study/avg lr=0." + "1" * 21 + "…"  # a legend's width


def test_the_overrides_are_a_tag_as_typed(tmp_path):
    [job] = load_jobs(write(tmp_path, BASE), ["engine.num_rounds=6", "tracking.tags={a: b c}"])
    assert naming_tags(job)["raysim.overrides"] == "engine.num_rounds=6 'tracking.tags={a: b c}'"
    [plain] = load_jobs(write(tmp_path, BASE))
    assert "raysim.overrides" not in naming_tags(plain)


def test_a_submitted_run_carries_the_submitting_checkouts_git_and_its_submission_id(tmp_path, monkeypatch):
    [job] = load_jobs(write(tmp_path, BASE))  # no repository here: as in the job's uploaded copy
    submitted = {"mlflow.source.git.commit": "abc123", "git_dirty": "true"}
    for key, value in submission_env(job, "raysubmit_42").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAYSIM_SUBMITTED_GIT", json.dumps(submitted))
    tags = source_tags(job, ["raysim", "run", "job.yaml"])
    source = "mlflow.source.name"
    assert tags == {source: "raysim run job.yaml", **submitted, "ray.submission_id": "raysubmit_42"}


def test_a_fresh_clone_with_a_runs_store_files_is_not_dirty(tmp_path):
    """raysim's .gitignore covers what a run writes in the working directory."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text((REPO / ".gitignore").read_text())
    subprocess.run([*git, "add", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], check=True)
    written = ("mlflow.db", "mlflow.db.lock", "mlflow.db-journal", "mlruns/1/x/meta", ".raysim/r/final.pt")
    for name in written:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert git_tags(tmp_path)["git_dirty"] == "false"
