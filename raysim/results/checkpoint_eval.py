"""An evaluation-only run (``raysim eval``): a checkpoint's global model evaluated with the engine's
own evaluations, logged as a child MLflow run of the run that wrote it. Nothing trains.

The target is a checkpoint file (``final.pt``, ``round_NNNNN.pt``), a run folder (its
``checkpoints/final.pt``) or an MLflow run id (its run folder's ``final.pt``, else that artifact).
The job is the checkpoint's own (upgraded by ``upgrade_saved_job``) with overrides of what an
evaluation may change: ``evaluation.*``, ``resources.*`` and ``tracking.*``. Anything else would
evaluate another model or another partition of the data than the checkpoint's, and is refused;
so is ``evaluation.heldout_fraction``, which decides which clients trained.

Usage:
    path = find_checkpoint("out/runs/tiny-20260101-120000-ab12cd", None, scratch)
    result = evaluate_checkpoint(path, ["evaluation.clients=5", "resources.backend=serial"])
    result.metrics["eval/clients/accuracy"], result.run_id  # logged at step result.round_num
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim import params as P
from raysim.checkpoint import Checkpoint, check_compatible, read_checkpoint
from raysim.config import JobConfig, apply_overrides
from raysim.config.job import validate_job
from raysim.config.renames import upgrade_saved_job
from raysim.engine.build import open_parts, start_workers
from raysim.engine.evaluation import EvaluationPlan, evaluate_global
from raysim.engine.preflight import preflight
from raysim.engine.resumed_state import refuse_nonfinite_checkpoint
from raysim.errors import CheckpointError, ConfigError
from raysim.results.analysis import FINAL, attach_run, final_checkpoint
from raysim.runtime.backend import Backend
from raysim.tracking.lineage import CHECKPOINTS_DIR, PARENT_RUN
from raysim.tracking.provenance import run_name
from raysim.tracking.tracker import RUN_DIR_TAG, MemoryTracker, MlflowTracker, Tracker
from raysim.types import Metrics, NumpyParams

EVALUABLE = ("evaluation.", "resources.", "tracking.")  # override prefixes an evaluation may change
FIXED_EVALUATION = ("evaluation.heldout_fraction",)  # which clients trained: part of the partition
RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id
# tags of an evaluation run
EVALUATED_CHECKPOINT = "evaluated_checkpoint"
EVALUATED_ROUND = "evaluated_round"
PARENT_RUN_ID = "mlflow.parentRunId"  # MLflow nests a run under the run this tag names
NAMING_TAGS = ("job", "variant")  # provenance.naming_tags of the source run, copied over


@dataclass(frozen=True)
class CheckpointEvaluation:
    """What ``evaluate_checkpoint`` measured, and where it logged it."""

    job: JobConfig  # the checkpoint's job, with the overrides
    checkpoint: Path
    round_num: int  # the checkpoint's last completed round: the step the metrics are logged at
    metrics: Metrics
    params: NumpyParams  # the evaluated model as it is after the evaluation
    run_id: str | None  # the evaluation's MLflow run; None: tracking is off
    source_run_id: str | None  # the run that wrote the checkpoint; None: not recorded
    is_child: bool  # the evaluation run's mlflow.parentRunId is the source run (the same store)


def find_checkpoint(target: str, tracking_uri: str | None, scratch: Path) -> Path:
    """The checkpoint ``target`` names: a checkpoint file, a run folder's ``final.pt``, or an
    MLflow run's, by id or name (downloaded into ``scratch`` when its run folder is gone).

    Raises:
        CheckpointError: ``target`` is none of these, or names no final checkpoint.
        RaysimError: a run id or name that the store (``tracking_uri``) does not hold, or a name
            several runs share.
    """
    path = Path(target).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return run_folder_checkpoint(path)
    if RUN_ID.fullmatch(target) or not looks_like_a_path(target):  # a run id, or a run's name
        tracker, run = attach_run(target, tracking_uri)
        run_dir = run.data.tags.get(RUN_DIR_TAG)
        return final_checkpoint(tracker.uri, run.info.run_id, Path(run_dir) if run_dir else None, scratch)
    raise CheckpointError(
        f"{target} is neither a checkpoint file nor a run folder (nor an MLflow run id or name); "
        f"pass a final.pt or round_NNNNN.pt, a run folder (<output-dir>/runs/<run>), a run id or name"
    )


def looks_like_a_path(target: str) -> bool:
    """A ``.pt`` file or a folder path (``runs/x/``): not a run name such as ``quickstart/fedavg``."""
    return target.endswith((".pt", "/")) or target.startswith((".", "/", "~"))


def run_folder_checkpoint(folder: Path) -> Path:
    """A run folder's final checkpoint (also given its ``checkpoints/`` folder itself)."""
    checkpoints = folder if folder.name == CHECKPOINTS_DIR else folder / CHECKPOINTS_DIR
    final = checkpoints / FINAL
    if final.is_file():
        return final
    rounds = sorted(checkpoints.glob("round_*.pt")) if checkpoints.is_dir() else []
    latest = f"; its latest round checkpoint is {rounds[-1]}, pass that file" if rounds else ""
    raise CheckpointError(
        f"{folder} is a folder but no finished run folder: it has no {CHECKPOINTS_DIR}/{FINAL}{latest}"
    )


def refuse_fixed_overrides(overrides: list[str], source: str) -> None:
    """Raises ConfigError, one line per override of a key that would change the model or the data
    partition (anything but ``evaluation.*``, ``resources.*``, ``tracking.*``)."""
    problems = []
    for item in overrides:
        key = item.partition("=")[0]
        if not key.startswith(EVALUABLE) or key.startswith(FIXED_EVALUATION):
            problems.append(
                f"{key}: cannot change in raysim eval, which evaluates the checkpoint's own model "
                f"on its own data partition; override only evaluation.* (not heldout_fraction), "
                f"resources.* or tracking.*, or train a run with it"
            )
    if problems:
        raise ConfigError(problems, source)


def evaluation_job(saved: dict[str, Any], overrides: list[str], source: str) -> JobConfig:
    """The checkpoint's job (as today's options name it) with the evaluation's overrides."""
    refuse_fixed_overrides(overrides, source)
    return validate_job(apply_overrides(upgrade_saved_job(saved), overrides), source)


def last_step(job: JobConfig) -> int:
    """The last step a run of ``job`` logs: its last round, or a staged method's closing step where
    that comes later (FuseFL's CCVR at step K, its config's ``num_stages``, whatever
    ``engine.num_rounds`` says)."""
    stages = getattr(job.algorithm.config, "num_stages", 0)
    return max(job.engine.num_rounds - 1, stages if isinstance(stages, int) else 0)


def refuse_implausible_round(round_num: int, job: JobConfig, path: str) -> None:
    """A checkpoint of a round its job never runs was edited or damaged: its metrics would be
    logged at that step (10**12, say) beside the run's real ones.

    Raises:
        CheckpointError: ``round_num`` is negative or after the job's last step.
    """
    last = last_step(job)
    if not 0 <= round_num <= last:
        raise CheckpointError(
            f"{path} says it ends after round {round_num}, but its job runs rounds 0..{last} "
            f"(engine.num_rounds={job.engine.num_rounds}); it was edited or damaged: evaluate another "
            f"checkpoint of the run (its checkpoints/ folder)"
        )


def evaluate_checkpoint(
    path: str | Path, overrides: list[str], tracking_uri: str | None = None
) -> CheckpointEvaluation:
    """Evaluates a checkpoint's global model (central, clients, held-out, personalization,
    transfer: as its job's ``evaluation`` says) and logs it at the checkpoint's round.

    Args:
        path: a checkpoint file.
        overrides: ``key=value`` of ``evaluation.*``, ``resources.*``, ``tracking.*``.
        tracking_uri: where the evaluation run goes unless ``tracking.tracking_uri`` is given;
            None: the store of the run that wrote the checkpoint, as the checkpoint recorded it.

    Raises:
        CheckpointError: a missing, corrupt or foreign checkpoint (CRC-checked), a non-finite
            one, one of a round its job never runs, or one that does not fit its job's model.
        ConfigError: an override of a key that cannot change, or an invalid one.
    """
    checkpoint = read_checkpoint(path, with_client_state=False)
    refuse_nonfinite_checkpoint(checkpoint.state, str(path), "evaluate")  # as --resume refuses it
    job = evaluation_job(checkpoint.job, overrides, str(path))
    refuse_implausible_round(checkpoint.round_num, job, str(path))
    source = checkpoint.run or {}
    store = tracking_uri or source.get("tracking_uri")
    if store and not is_overridden(overrides, "tracking.tracking_uri"):
        job = with_tracking(job, tracking_uri=store)
    preflight(job)  # the tracking store and Ray address answer, before the data is opened
    parts = open_parts(job)
    check_compatible(checkpoint.state, parts.params, str(path))
    with tempfile.TemporaryDirectory(prefix="raysim-eval-") as scratch:
        backend = start_workers(parts, Path(scratch) / "client_state")  # no client state is read
        try:  # the run starts once the workers do, as build() starts a run
            named = is_overridden(overrides, "tracking.run_name")
            tracker, job, is_child = start_tracker(job, checkpoint, named)
            metrics = run_evaluation(backend, parts.plan, checkpoint, tracker)
        finally:
            backend.shutdown()
    return CheckpointEvaluation(
        job,
        checkpoint.path,
        checkpoint.round_num,
        metrics,
        P.to_numpy(checkpoint.state.params),
        tracker.run_id,
        source.get("run_id"),
        is_child,
    )


def run_evaluation(
    backend: Backend, plan: EvaluationPlan, checkpoint: Checkpoint, tracker: Tracker
) -> Metrics:
    """The evaluation over the workers, logged at the checkpoint's round; the tracker's run ends
    FINISHED, or FAILED (KILLED) when it raised (was interrupted)."""
    status = "FAILED"
    try:  # personalization and transfer are seeded by the round, as in the source run
        metrics = evaluate_global(backend, checkpoint.state.params, plan, checkpoint.round_num)
        tracker.log_metrics(metrics, step=checkpoint.round_num)
        status = "FINISHED"
        return metrics
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.finish(status)


def start_tracker(job: JobConfig, checkpoint: Checkpoint, is_named: bool) -> tuple[Tracker, JobConfig, bool]:
    """The evaluation's run, begun: named ``<source run>/eval`` (unless ``is_named``: the user
    gave ``tracking.run_name``), a child of the source run where this store holds it, else
    tagged ``parent_run``.

    Returns:
        The tracker, the job as logged (with its run name) and whether the run is a child.
    """
    if not job.tracking.enabled:
        tracker = MemoryTracker()
        tracker.start(job)
        return tracker, job, False
    mlflow_tracker = MlflowTracker(job.tracking)
    source_id = (checkpoint.run or {}).get("run_id")
    source = source_run(mlflow_tracker, source_id)
    if not is_named:
        base = source.info.run_name if source is not None else run_name(job)
        job = with_tracking(job, run_name=f"{base}/eval")
    mlflow_tracker.start(job)
    assert mlflow_tracker.run_id is not None  # started
    tags = {EVALUATED_CHECKPOINT: str(checkpoint.path.absolute()), EVALUATED_ROUND: str(checkpoint.round_num)}
    if source is not None:  # filters on the source's job and variant find its evaluations too
        tags |= {key: source.data.tags[key] for key in NAMING_TAGS if key in source.data.tags}
        tags[PARENT_RUN_ID] = source.info.run_id
    elif source_id is not None:
        tags[PARENT_RUN] = f"{source_id} in {(checkpoint.run or {}).get('tracking_uri')}"
    from mlflow.entities import RunTag

    mlflow_tracker.client.log_batch(mlflow_tracker.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return mlflow_tracker, job, source is not None


def source_run(tracker: MlflowTracker, run_id: str | None) -> Any:
    """The MLflow run that wrote the checkpoint, if this store holds it (else None)."""
    from mlflow.exceptions import MlflowException

    if run_id is None:
        return None
    try:
        return tracker.client.get_run(run_id)
    except MlflowException:
        return None


def is_overridden(overrides: list[str], key: str) -> bool:
    """Whether one of ``overrides`` (``key=value``) sets ``key`` itself."""
    return any(item.partition("=")[0] == key for item in overrides)


def with_tracking(job: JobConfig, **changes: Any) -> JobConfig:
    """``job`` with ``tracking`` options changed (valid values: no validation needed)."""
    return job.model_copy(update={"tracking": job.tracking.model_copy(update=changes)})
