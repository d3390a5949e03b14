"""What a resume continues from: a checkpoint's server state, checked (rounds left, shapes, finite
values) and rebuilt as this run's plugin state; a fresh run's state where there is no checkpoint."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from raysim import params as P
from raysim.algorithm import AnyAlgorithm
from raysim.checkpoint import Checkpoint, CheckpointTrail, check_compatible, read_checkpoint
from raysim.config import JobConfig
from raysim.config.renames import upgrade_saved_job
from raysim.errors import CheckpointError, ConfigError
from raysim.plugin_defaults import fresh_state, resume_state
from raysim.stored import plain, rebuild
from raysim.tracking.lineage import refuse_another_job
from raysim.types import RunInfo, ServerState


def resumable_checkpoint(path: str, job: JobConfig, branch: bool) -> Checkpoint:
    """The checkpoint a run resumes from, checked before its data is opened (the run, and
    ``raysim run --dry-run --resume``): whole, of this job unless ``branch``, with a round left,
    finite; in today's option names. Its shapes are checked against the built model later
    (``initial_state``)."""
    checkpoint = read_checkpoint(path)
    checkpoint = replace(checkpoint, job=upgrade_saved_job(checkpoint.job))  # written before renames
    refuse_another_job(checkpoint, job.to_dict(), branch)
    check_rounds_left(checkpoint.round_num, job.engine.num_rounds, str(checkpoint.path))
    refuse_nonfinite_checkpoint(checkpoint.state, str(checkpoint.path))
    return checkpoint


def initial_state(
    algorithm: AnyAlgorithm[Any],
    params: P.Params,
    info: RunInfo,
    job: JobConfig,
    checkpoint: Checkpoint | None,
) -> tuple[ServerState, int]:
    """The plugin's fresh state (``fresh_state``), or a checkpoint's (completed by the plugin's
    ``resume_state``).

    Returns:
        The state and the first round to run.
    """
    fresh = fresh_state(algorithm, params, info)
    if checkpoint is None:
        return fresh, 0
    path, last_round = str(checkpoint.path), checkpoint.round_num
    check_rounds_left(last_round, job.engine.num_rounds, path)
    check_compatible(checkpoint.state, params, path)
    refuse_nonfinite_checkpoint(checkpoint.state, path)
    trail = CheckpointTrail(checkpoint.path, last_round, checkpoint.state)
    state = resume_state(algorithm, checkpoint.state, fresh, trail)
    return typed_like(fresh, state, job.algorithm.name, path), last_round + 1


def refuse_nonfinite_checkpoint(state: ServerState, path: str, action: str = "resume from") -> None:
    """A checkpoint whose model or server optimizer holds NaN or infinity cannot be resumed: every
    client would train from it and fail, and the run would blame their learning rates. Nor is it
    evaluated (``action``: "evaluate"): its scores would be those of no model the run trained."""
    saved = {"params": state.params, "opt_state": state.opt_state}
    if not P.is_finite(saved):
        bad = P.nonfinite_names(saved)
        raise CheckpointError(
            f"{path} is non-finite: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} "
            f"hold{'s' if len(bad) == 1 else ''} NaN or infinity; {action} an earlier checkpoint "
            f"of the run (its checkpoints/ folder)"
        )


def check_rounds_left(last_round: int, num_rounds: int, resume_from: str) -> None:
    """A resumed run must have a round left to run: otherwise it would open workers and an MLflow
    run, train nothing and write a final checkpoint identical to the one it resumed."""
    if last_round >= num_rounds - 1:
        raise ConfigError(
            [
                f"engine.num_rounds: {resume_from} already completed rounds 0..{last_round}, so a run of "
                f"{num_rounds} {'round' if num_rounds == 1 else 'rounds'} has none left; raise "
                f"engine.num_rounds above {last_round + 1} (engine.num_rounds={last_round + 1 + num_rounds} "
                f"runs {num_rounds} more)"
            ]
        )


def typed_like(fresh: ServerState, saved: ServerState, algorithm: str, path: str) -> ServerState:
    """``saved`` with its plain ``extra`` (the dict of the plugin's fields, as the checkpoint holds
    it) rebuilt as the plugin's state type, the one ``init`` made for ``fresh``.

    A checkpoint must hold the fields this job's algorithm keeps (branching between algorithms of
    one family, FedAvg to FedAdam say, is fine; a plugin's ``resume_state`` hook completes state
    that an older plugin or another of its family did not write).

    Raises:
        CheckpointError: the checkpoint's plugin state has other fields.
    """
    try:
        extra = rebuild(fresh.extra, plain(saved.extra), "its server state")
    except ValueError as exc:
        raise CheckpointError(
            f"{path}: {exc}; it was written by another kind of algorithm than {algorithm!r}"
        ) from None
    return replace(saved, extra=extra)
