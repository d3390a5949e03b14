"""Where a resumed run's history goes: on in the MLflow run that wrote the checkpoint, or into a
new run branched from it.

``raysim run --resume CKPT`` continues the same run (same run id, metrics at the next steps, same
run folder) when nothing but ``engine.num_rounds`` changed and the checkpoint is the last state
that run logged. Anything else (another config, an earlier round's checkpoint of a run that went
on, a run this store does not hold, ``--branch``) starts a new run whose ``mlflow.parentRunId`` is
the checkpoint's run, tagged with the checkpoint and its round.

Of two drivers resuming one checkpoint at once, exactly one continues: continuing takes the run
folder's ``driver.lock`` (``raysim.tracking.driver_lock``); the other branches, naming the holder.

Usage:
    lineage = decide(checkpoint, job.to_dict(), parent, experiment_id, branch=False)
    lineage.continues, lineage.describe()
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from raysim.checkpoint import Checkpoint
from raysim.config import flatten
from raysim.config.job import RESUMABLE_CHANGES
from raysim.errors import CheckpointError

CHECKPOINTS_DIR = "checkpoints"  # a run folder's checkpoints sit in <run_dir>/checkpoints/
# tags of a resumed or branched run
RESUMED_FROM = "resumed_from"  # the checkpoint file
RESUMED_FROM_ROUND = "resumed_from_round"  # its last completed round
NUM_ROUNDS = "num_rounds"  # a continued run's current engine.num_rounds (params cannot change)
PARENT_RUN = "parent_run"  # a branch's parent when this store does not hold it: "<id> in <uri>"


@dataclass(frozen=True)
class ParentRun:
    """The run that wrote a checkpoint, as the current store knows it."""

    run_id: str
    experiment_id: str
    last_step: int | None  # the last step it logged metrics at; None: none logged
    running: bool = False  # RUNNING and not ended: another driver may be writing to it now


@dataclass(frozen=True)
class Lineage:
    """What a resumed run continues or branches from, and why."""

    checkpoint: Path
    round_num: int  # the checkpoint's last completed round
    continues: bool  # True: log into the parent run itself
    parent_run_id: str | None  # the run that wrote the checkpoint; None: not recorded
    parent_in_store: bool  # the current store holds that run (it can be the mlflow.parentRunId)
    parent_uri: str | None  # the store it was logged to, as the checkpoint recorded it
    reason: str  # why it branches (empty when it continues)

    @property
    def run_dir(self) -> Path:
        """The parent's run folder, which a continued run goes on writing into."""
        return self.checkpoint.absolute().parent.parent

    def tags(self, num_rounds: int) -> dict[str, str]:
        tags = {RESUMED_FROM: str(self.checkpoint.absolute()), RESUMED_FROM_ROUND: str(self.round_num)}
        if self.continues:
            return tags | {NUM_ROUNDS: str(num_rounds)}
        if self.parent_run_id is not None and not self.parent_in_store:
            return tags | {PARENT_RUN: f"{self.parent_run_id} in {self.parent_uri}"}
        return tags

    def describe(self) -> str:
        """One line for the console: what resuming did."""
        where = f"{self.checkpoint} (round {self.round_num})"
        if self.continues:
            return f"continuing MLflow run {self.parent_run_id} from {where}"
        parent = f", child of run {self.parent_run_id}" if self.parent_in_store else ""
        return f"branching a new MLflow run{parent} from {where}: {self.reason}"


def decide(
    checkpoint: Checkpoint,
    job: dict[str, Any],
    parent: ParentRun | None,
    experiment_id: str | None,
    branch: bool = False,
    held_by: str | None = None,
) -> Lineage:
    """Continue the checkpoint's run, or branch a new one from it (a pure function).

    Args:
        checkpoint: the checkpoint resumed from (its ``run`` names the run that wrote it).
        job: the resolved config of the resuming job (``JobConfig.to_dict``).
        parent: that run as the current store holds it; None when the store does not.
        experiment_id: the experiment the resuming job logs to.
        branch: ``--branch``: never continue.
        held_by: who holds the run folder when another driver does (``claim_run_folder``).
    """
    saved = checkpoint.run or {}
    run_id = saved.get("run_id")
    lineage = Lineage(
        checkpoint.path,
        checkpoint.round_num,
        continues=False,
        parent_run_id=run_id,
        parent_in_store=parent is not None,
        parent_uri=saved.get("tracking_uri"),
        reason="",
    )
    reason = _why_branch(checkpoint, job, run_id, parent, experiment_id, branch, held_by)
    return replace(lineage, reason=reason) if reason else replace(lineage, continues=True)


def _why_branch(
    checkpoint: Checkpoint,
    job: dict[str, Any],
    run_id: str | None,
    parent: ParentRun | None,
    experiment_id: str | None,
    branch: bool,
    held_by: str | None,
) -> str:
    """Why the resumed run cannot be the checkpoint's own run; empty when it can."""
    if branch:
        return "--branch"
    if run_id is None:
        return "the checkpoint names no MLflow run (tracking was off, or an older raysim wrote it)"
    if parent is None:
        uri = (checkpoint.run or {}).get("tracking_uri")
        return f"this MLflow store has no run {run_id} (it was logged to {uri})"
    if held_by is not None:
        return f"another driver is continuing run {run_id}: {held_by}"
    if parent.running:
        return f"run {run_id} is still RUNNING (another driver may be logging to it)"
    if parent.experiment_id != experiment_id:
        return f"run {run_id} is in another experiment (tracking.experiment changed)"
    changed = config_changes(checkpoint.job, job)
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return f"the config changed ({', '.join(changed[:3])}{more})"
    if parent.last_step is not None and parent.last_step > checkpoint.round_num:
        return (
            f"run {run_id} went on to round {parent.last_step} after this checkpoint; continuing "
            f"it would log rounds {checkpoint.round_num + 1}..{parent.last_step} twice"
        )
    if checkpoint.path.absolute().parent.name != CHECKPOINTS_DIR:
        return f"the checkpoint is not in its run folder's {CHECKPOINTS_DIR}/ (a copy?)"
    return ""


def refuse_another_job(checkpoint: Checkpoint, job: dict[str, Any], branch: bool) -> None:
    """A checkpoint of another job (its config differs beyond ``RESUMABLE_CHANGES``) resumes only
    when asked: ``--branch`` (``branch=True``) starts a new run of this job from it.

    Raises:
        CheckpointError: the configs differ and ``branch`` is off, naming the keys.
    """
    changed = config_changes(checkpoint.job, job)
    if changed and not branch:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise CheckpointError(
            f"--resume {checkpoint.path}: it was written by another job (the config changed: "
            f"{', '.join(changed[:3])}{more}); resume it with that job, or pass --branch "
            "(raysim.run(..., branch=True)) to start a new run of this job from it"
        )


def config_changes(saved: dict[str, Any], job: dict[str, Any]) -> list[str]:
    """The config keys whose values differ, apart from those a continued run may change."""
    old, new = flatten(saved), flatten(job)
    return sorted(
        key
        for key in old.keys() | new.keys()
        if old.get(key) != new.get(key) and not key.startswith(RESUMABLE_CHANGES)
    )
