"""Resuming continues the checkpoint's MLflow run only when the history stays one story: the same
config but ``engine.num_rounds`` (and how or where it runs), the same store and experiment, and
the checkpoint the run's last logged state in its own run folder; anything else branches."""

from pathlib import Path

import pytest
import torch

from raysim.checkpoint import Checkpoint
from raysim.errors import CheckpointError
from raysim.tracking.lineage import ParentRun, config_changes, decide, refuse_another_job
from raysim.types import ServerState

JOB = {
    "name": "avg",
    "engine": {"num_rounds": 4, "cohort_size": 3},
    "algorithm": {"name": "fedavg", "local": {"lr": 0.1}},
    "resources": {"num_workers": 2},
    "tracking": {"progress": True},
}
SAVED = {**JOB, "engine": {"num_rounds": 2, "cohort_size": 3}, "tracking": {"progress": False}}
RUN = {"run_id": "r1", "tracking_uri": "sqlite:///old/mlflow.db"}


def checkpoint(job=SAVED, run=RUN, path="out/runs/avg-1/checkpoints/final.pt", round_num=1) -> Checkpoint:
    return Checkpoint(Path(path), ServerState({"w": torch.zeros(1)}), round_num, job, None, run)


def parent(experiment_id="1", last_step=1, running=False) -> ParentRun:
    return ParentRun("r1", experiment_id, last_step, running)


def test_more_rounds_of_the_same_config_continue_the_run():
    lineage = decide(checkpoint(), JOB, parent(), "1")
    assert lineage.continues and lineage.parent_run_id == "r1" and lineage.reason == ""
    assert lineage.run_dir == Path("out/runs/avg-1").absolute()
    assert lineage.tags(num_rounds=4) == {
        "resumed_from": str(Path("out/runs/avg-1/checkpoints/final.pt").absolute()),
        "resumed_from_round": "1",
        "num_rounds": "4",
    }
    assert lineage.describe().startswith("continuing MLflow run r1 from out/runs/avg-1/checkpoints/final.pt")


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ({"branch": True}, "--branch"),
        ({"checkpoint": checkpoint(run=None)}, "names no MLflow run"),
        ({"parent": None}, "this MLflow store has no run r1 (it was logged to sqlite:///old/mlflow.db)"),
        ({"experiment_id": "2"}, "another experiment"),
        ({"job": {**JOB, "algorithm": {"name": "fedavg", "local": {"lr": 0.05}}}}, "(algorithm.local.lr)"),
        ({"parent": parent(last_step=5)}, "went on to round 5 after this checkpoint"),
        ({"parent": parent(running=True)}, "still RUNNING"),  # a live driver's run is never taken over
        ({"held_by": "pid 7 on h holds x"}, "another driver is continuing run r1: pid 7 on h holds x"),
        ({"checkpoint": checkpoint(path="copies/final.pt")}, "not in its run folder's checkpoints/"),
    ],
)
def test_anything_else_branches_and_says_why(case, why):
    args = {"checkpoint": checkpoint(), "job": JOB, "parent": parent(), "experiment_id": "1"} | case
    lineage = decide(**args)
    assert not lineage.continues and why in lineage.reason
    assert lineage.describe().startswith("branching a new MLflow run") and why in lineage.describe()


def test_a_branch_names_a_parent_it_cannot_link():
    """``mlflow.parentRunId`` must name a run of the same store; another store's is a plain tag."""
    here = decide(checkpoint(), JOB, parent(), "1", branch=True)
    assert here.parent_in_store and "child of run r1" in here.describe() and "parent_run" not in here.tags(4)
    elsewhere = decide(checkpoint(), JOB, None, "1")
    assert elsewhere.tags(4)["parent_run"] == "r1 in sqlite:///old/mlflow.db"
    assert "num_rounds" not in elsewhere.tags(4)


def test_config_changes_ignore_rounds_tracking_and_resources_only():
    changed = {**JOB, "seed": 1, "resources": {"num_workers": 8}, "tracking": {"experiment": "x"}}
    assert config_changes(SAVED, changed) == ["seed"]
    assert config_changes(SAVED, {**JOB, "engine": {"num_rounds": 9, "cohort_size": 5}}) == [
        "engine.cohort_size"
    ]


def test_another_jobs_checkpoint_is_refused_unless_branching_is_asked_for():
    """It used to resume with one "branching" line: a wrong --resume went unnoticed."""
    other = {**SAVED, "algorithm": {"name": "fedprox", "local": {"lr": 0.05}}}
    with pytest.raises(CheckpointError) as info:
        refuse_another_job(checkpoint(), other, branch=False)
    message = str(info.value)
    assert "written by another job (the config changed: algorithm.local.lr, algorithm.name)" in message
    assert "pass --branch" in message and "\n" not in message
    refuse_another_job(checkpoint(), other, branch=True)  # asked for: a new run from it
    refuse_another_job(
        checkpoint(), {**SAVED, "engine": {"num_rounds": 9, "cohort_size": 3}}, branch=False
    )  # more rounds
