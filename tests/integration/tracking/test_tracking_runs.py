"""MLflow runs as a researcher finds them: named ``job/variant``, tagged with the job's git commit
and command line; ``raysim run --resume`` continues the same run or branches a child of it; a
store folder copied elsewhere still serves its artifacts."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from raysim.cli.main import main
from raysim.tracking.tracking_store import download_artifact

JOB = {
    "name": "tiny",
    "seed": 1,
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 8}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 32, "lr": 0.1}},
    "engine": {"num_rounds": 2, "cohort_size": 3},
    "evaluation": {"every": 1},
    "resources": {"backend": "serial"},
    "tracking": {"experiment": "lineage", "progress": False},
    "variants": [{"name": "avg"}],
}


@pytest.fixture
def job_repo(tmp_path):
    """A git repository holding the job file, committed once: (job path, commit)."""
    repo = tmp_path / "study"
    repo.mkdir()
    (repo / "tiny.yaml").write_text(yaml.safe_dump(JOB))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "tiny.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "job"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return repo / "tiny.yaml", commit.stdout.strip()


def raysim_run(job_path, out, *args):
    code = main(["run", str(job_path), "--output-dir", str(out), *args])
    assert code == 0


def only_run(client, experiment="lineage", **filters):
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    query = " and ".join(f"tags.{k} = '{v}'" for k, v in filters.items())
    return client.search_runs([experiment_id], query)


def test_a_run_is_named_job_variant_and_tagged_with_its_source(job_repo, tmp_path, tracking_uri, monkeypatch):
    job_path, commit = job_repo
    monkeypatch.setattr(sys, "argv", ["/venv/bin/raysim", "run", str(job_path)])
    raysim_run(job_path, tmp_path / "out")
    [run] = only_run(MlflowClient(tracking_uri))
    tags = run.data.tags
    assert run.info.run_name == "tiny/avg" and run.info.status == "FINISHED"
    assert (tags["job"], tags["variant"], tags["algorithm"]) == ("tiny", "avg", "fedavg")
    assert tags["mlflow.source.git.commit"] == commit and tags["git_dirty"] == "false"
    assert tags["mlflow.source.name"] == f"raysim run {job_path}"
    assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.user"]
    assert "mlflow.parentRunId" not in tags


def test_resume_continues_the_same_run(job_repo, tmp_path, tracking_uri, capsys):
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out")
    client = MlflowClient(tracking_uri)
    [first] = only_run(client)
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/final.pt")
    raysim_run(job_path, tmp_path / "elsewhere", "--resume", str(checkpoint), "engine.num_rounds=4")
    assert f"continuing MLflow run {first.info.run_id}" in capsys.readouterr().err
    [run] = only_run(client)  # no second run
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0, 1, 2, 3]
    assert run.data.params["engine.num_rounds"] == "2"  # MLflow params never change ...
    assert run.data.tags["num_rounds"] == "4" and run.data.tags["resumed_from_round"] == "1"  # ... tags do
    run_dir = checkpoint.parent.parent  # the later checkpoint sits with the earlier one
    assert run.data.tags["run_dir"] == str(run_dir) and not (tmp_path / "elsewhere").exists()
    from raysim.checkpoint import read_checkpoint

    assert read_checkpoint(checkpoint).round_num == 3
    cohorts = yaml.safe_load((run_dir / "cohorts.json").read_text())
    assert cohorts["first_round"] == 0 and len(cohorts["cohorts"]) == 4  # both legs' cohorts
    history = json.loads((run_dir / "history.json").read_text())  # the learning curve's data
    assert [step for step, m in history if "train/loss" in m] == [0, 1, 2, 3]
    config = download_artifact(tracking_uri, run.info.run_id, "config/job.yaml", tmp_path)
    job = yaml.safe_load(config.read_text())
    assert job["engine"]["num_rounds"] == 4


def test_resume_by_run_name_continues_that_run(job_repo, tmp_path, tracking_uri, capsys):
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out")
    client = MlflowClient(tracking_uri)
    [first] = only_run(client)
    raysim_run(job_path, tmp_path / "out", "--resume", "tiny/avg", "engine.num_rounds=3")
    assert f"continuing MLflow run {first.info.run_id}" in capsys.readouterr().err
    [run] = only_run(client)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0, 1, 2]


def test_a_checkpoint_written_before_the_option_renames_continues_its_run(
    job_repo, tmp_path, tracking_uri, capsys
):
    """Its job dict spells FedAdam's second-moment start the old way (tau_squared, now
    eps_squared): the user changed nothing, so resuming continues the same run."""
    import torch

    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out", "algorithm.name=fedadam")
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/final.pt")
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["job"]["algorithm"]["server"]["initial_second_moment"] == "eps_squared"
    saved["job"]["algorithm"]["server"]["initial_second_moment"] = "tau_squared"  # as raysim wrote it
    torch.save(saved, checkpoint)
    raysim_run(job_path, tmp_path / "out", "algorithm.name=fedadam", "--resume", str(checkpoint),
               "engine.num_rounds=3")  # fmt: skip
    err = capsys.readouterr().err
    assert "continuing MLflow run" in err and "config changed" not in err
    [run] = only_run(MlflowClient(tracking_uri))
    assert run.info.status == "FINISHED"


def test_resume_with_another_config_is_refused_unless_it_branches_a_child_run(
    job_repo, tmp_path, tracking_uri, capsys
):
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out")
    client = MlflowClient(tracking_uri)
    [parent] = only_run(client)
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/final.pt")
    changed = ["engine.num_rounds=3", "algorithm.local.lr=0.05"]
    assert (
        main(
            [
                "run",
                str(job_path),
                "--output-dir",
                str(tmp_path / "out"),
                "--resume",
                str(checkpoint),
                *changed,
            ]
        )
        == 2
    )
    assert "written by another job (the config changed: algorithm.local.lr); " in capsys.readouterr().err
    raysim_run(job_path, tmp_path / "out", "--resume", str(checkpoint), "--branch", *changed)
    assert "branching a new MLflow run, child of run" in capsys.readouterr().err
    [child] = [r for r in only_run(client) if r.info.run_id != parent.info.run_id]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["resumed_from"] == str(checkpoint) and child.data.tags["resumed_from_round"] == "1"
    assert child.info.run_name == "tiny/avg num_rounds=3 lr=0.05" and child.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(child.info.run_id, "train/loss")] == [2]
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "train/loss")] == [0, 1]


def test_branch_flag_branches_even_when_it_could_continue(job_repo, tmp_path, tracking_uri, capsys):
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out")
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/final.pt")
    raysim_run(job_path, tmp_path / "out", "--resume", str(checkpoint), "--branch", "engine.num_rounds=3")
    assert "branching a new MLflow run, child of run" in capsys.readouterr().err
    assert len(only_run(MlflowClient(tracking_uri))) == 2


def test_a_resume_while_another_driver_continues_the_run_branches_naming_it(
    job_repo, tmp_path, tracking_uri, capsys
):
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out")
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/final.pt")
    lock = checkpoint.parent.parent / "driver.lock"
    assert not lock.exists()  # the first run holds none once it has ended
    lock.write_text("pid 4242 on node-7\n")  # the first of two resumes of this checkpoint, still going
    raysim_run(job_path, tmp_path / "out", "--resume", str(checkpoint), "engine.num_rounds=3")
    err = " ".join(capsys.readouterr().err.split())
    assert "branching a new MLflow run" in err and "another driver is continuing run" in err
    assert f"pid 4242 on node-7 holds {lock}" in err
    assert lock.read_text() == "pid 4242 on node-7\n"  # the other driver's lock is not ours to remove
    [parent, child] = sorted(only_run(MlflowClient(tracking_uri)), key=lambda r: r.info.start_time)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id


@pytest.mark.slow  # two drivers, each starting in a fresh process
def test_of_two_resumes_of_one_checkpoint_started_at_once_exactly_one_continues_its_run(
    job_repo, tmp_path, tracking_uri
):
    """Before driver.lock both printed "continuing MLflow run" and logged the new rounds twice.

    They resume from round_00001.pt, which the continuing driver never rewrites (its final.pt it
    does: a driver reading that after the other's end would find no rounds left). A driver that
    reads the checkpoint only after the other has logged rounds past it branches too."""
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out", "engine.checkpoint_every=1")
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/round_00001.pt")
    command = [sys.executable, "-m", "raysim", "run", str(job_path), "--output-dir", str(tmp_path / "out")]
    command += ["--resume", str(checkpoint), "engine.num_rounds=4", "engine.checkpoint_every=1"]
    drivers = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [" ".join(driver.communicate(timeout=600)[1].split()) for driver in drivers]
    assert [driver.returncode for driver in drivers] == [0, 0], said
    assert sorted("continuing MLflow run" in err for err in said) == [False, True], said
    assert any("branching a new MLflow run" in err for err in said), said
    client = MlflowClient(tracking_uri)
    [parent] = [run for run in only_run(client) if "mlflow.parentRunId" not in run.data.tags]
    for key in parent.data.metrics:
        steps = [metric.step for metric in client.get_metric_history(parent.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {sorted(steps)}"
    assert not (checkpoint.parent.parent / "driver.lock").exists()


def test_a_continued_run_removes_its_lock_at_its_end(job_repo, tmp_path, tracking_uri, capsys):
    job_path, _ = job_repo
    raysim_run(job_path, tmp_path / "out")
    [checkpoint] = (tmp_path / "out").glob("runs/*/checkpoints/final.pt")
    raysim_run(job_path, tmp_path / "out", "--resume", str(checkpoint), "engine.num_rounds=3")
    assert "continuing MLflow run" in capsys.readouterr().err
    assert not (checkpoint.parent.parent / "driver.lock").exists()


def test_a_copied_store_serves_its_artifacts_from_the_new_place(tmp_path, monkeypatch):
    store = tmp_path / "store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    job = {k: v for k, v in JOB.items() if k != "variants"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    raysim_run(tmp_path / "job.yaml", tmp_path / "out")
    moved = tmp_path / "copy" / "store"
    shutil.copytree(store, moved)
    shutil.rmtree(store)
    uri = f"sqlite:///{moved / 'mlflow.db'}"
    [run] = only_run(MlflowClient(uri))
    assert run.info.artifact_uri == f"mlruns/{run.info.experiment_id}/{run.info.run_id}/artifacts"
    final = download_artifact(uri, run.info.run_id, "final.pt", tmp_path / "got")
    from raysim.checkpoint import read_state

    assert read_state(final)[1] == 1
    monkeypatch.chdir(moved)  # MLflow's own client (and `mlflow ui`) resolve it from the store's folder
    names = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)}
    assert {"final.pt", "learning_curve.png", "config"} <= names
