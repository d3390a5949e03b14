"""``build(job)``: every object of a run is made here, and checked before Ray or MLflow start."""

from __future__ import annotations

import importlib.util
import shutil
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from raysim import params as P
from raysim import registry
from raysim.algorithm import AnyAlgorithm, has_personal_model
from raysim.checkpoint import Checkpoint
from raysim.config import JobConfig, probes_never_due
from raysim.data.prepare import open_dataset
from raysim.data.round_data import check_training_options, dataset_options, with_validation_split
from raysim.data.store import ClientStore
from raysim.engine.async_state import open_asynchrony
from raysim.engine.downlink_setup import open_downlink
from raysim.engine.engine import Engine
from raysim.engine.eval_plan import evaluation_plan, open_transfer_stores
from raysim.engine.evaluation import EvaluationPlan, TimeToTarget, keep_personalizable
from raysim.engine.model_check import check_model_fits, check_model_groups, check_plugin_model
from raysim.engine.preflight import preflight
from raysim.engine.privacy_setup import open_privacy
from raysim.engine.resumed_state import initial_state, resumable_checkpoint
from raysim.engine.selection_setup import open_selection
from raysim.engine.system_clock import check_time_to_target, open_system
from raysim.errors import ConfigError, ResourceError
from raysim.privacy.run_privacy import RunPrivacy
from raysim.privacy.sample_level import sample_privacy_problems
from raysim.probe import Probe, check_probes
from raysim.robust.placement import release_device
from raysim.robust.release import RunRobust, check_resumable
from raysim.runtime.backend import Backend, SerialBackend
from raysim.runtime.builders import build_algorithm, build_job_model, build_probes, job_plugins
from raysim.runtime.chunks import check_vectorize
from raysim.runtime.client_state import ClientStateStore
from raysim.runtime.gpu_auto import SizedResources, sized_resources
from raysim.runtime.gpu_sizing import probe_work
from raysim.runtime.memory import keep_round_memory
from raysim.runtime.wire import WorkerSetup
from raysim.sampling import CohortSchedule, split_population
from raysim.systems.rounds import SimulatedSystem
from raysim.tracking.driver_lock import claim_run_folder, release_run_folder
from raysim.tracking.lineage import CHECKPOINTS_DIR, Lineage, decide
from raysim.tracking.tracker import MemoryTracker, MlflowTracker, Tracker
from raysim.types import RunInfo, ServerState


@dataclass(frozen=True)
class JobParts:
    """A job's pieces that exist before any process does: data, plugins, the initial model and the
    evaluation plan. ``build`` starts a run from it; ``raysim analyze`` evaluates a finished run's
    checkpoints with it, without training or a new MLflow run."""

    job: JobConfig
    store: ClientStore
    transfer: dict[str, ClientStore]
    algorithm: AnyAlgorithm[Any]
    probes: dict[str, Probe]
    params: P.Params  # the initial model, rebuilt from the seed
    info: RunInfo
    train_pool: np.ndarray
    schedule: CohortSchedule | None
    plan: EvaluationPlan


def build(
    job: JobConfig,
    tracker: Tracker | None,
    resume_from: str | None,
    output_dir: Path,
    branch: bool = False,
) -> tuple[Engine[Any], ServerState]:
    """Builds every object of a run (here and nowhere else) and the starting server state.

    Everything that can be checked is checked before Ray workers or an MLflow run exist. A resumed
    run continues the MLflow run (and run folder) of its checkpoint, or branches a new one from it
    (``raysim.tracking.lineage``; ``branch`` forces the latter).
    """
    if job.note:  # what the job's author wants read before its results (a surprising score)
        Console(stderr=True).print(f"note ({job.name}): {job.note}", highlight=False, soft_wrap=True)
    check_installed(job)
    preflight(job, tracking=tracker is None)  # seconds, not minutes, for a store or cluster that is down
    checkpoint = resumable_checkpoint(resume_from, job, branch) if resume_from is not None else None
    parts = open_parts(job)
    system = open_system(job, parts.store, parts.train_pool, parts.params, parts.algorithm)
    check_time_to_target(job, parts.info)
    state, start_round = initial_state(parts.algorithm, parts.params, parts.info, job, checkpoint)
    check_resumable(job.robust, start_round)
    if parts.schedule is not None:  # checked whole here, not at the round it lacks
        parts.schedule.check_runs(start_round, job.engine.num_rounds - 1)
    if job.robust is not None:
        release_device(job)  # robust.device: cuda without a GPU, refused before the workers start
    examples = parts.store.num_examples("train")
    private = open_privacy(job, parts.algorithm, parts.train_pool, examples, checkpoint)
    selector = open_selection(job, parts.store, parts.algorithm, system, checkpoint)
    asynchrony = open_asynchrony(job, system, state, start_round, checkpoint)
    tracker = tracker or (MlflowTracker(job.tracking) if job.tracking.enabled else MemoryTracker())
    lineage = resume_lineage(tracker, job, checkpoint, branch) if checkpoint is not None else None
    if lineage is not None and lineage.continues:
        run_dir = lineage.run_dir  # later checkpoints sit beside the earlier ones
    else:
        run_dir = new_run_dir(output_dir, job.name)
    try:
        engine = start_run(parts, tracker, run_dir, checkpoint, lineage, start_round, system, private)
        engine.selector = selector  # the clock's cohorts are its too (open_selection)
        engine.downlink = open_downlink(job, checkpoint)
        engine.asynchrony = asynchrony
        if engine.targets is not None and checkpoint is not None:  # each value logged once a run
            engine.targets.restore(checkpoint.time_to_target)
        return engine, state
    except BaseException:
        release_run_folder(run_dir)  # a continued run's lock, taken in resume_lineage
        raise


def start_run(
    parts: JobParts,
    tracker: Tracker,
    run_dir: Path,
    checkpoint: Checkpoint | None,
    lineage: Lineage | None,
    start_round: int,
    system: SimulatedSystem | None,
    privacy: RunPrivacy | None = None,
) -> Engine[Any]:
    """The client state restored, the workers started and the MLflow run begun, in ``run_dir``."""
    if lineage is not None and lineage.continues:
        shutil.rmtree(run_dir / "client_state", ignore_errors=True)  # may hold rounds past it
    state_dir = run_dir / "client_state"
    if checkpoint is not None and checkpoint.state_dir is not None:  # its frozen snapshot
        ClientStateStore(state_dir).restore(checkpoint.state_dir)
    backend, sizing = start_sized_workers(parts, state_dir)
    try:
        tracker.start(sizing.with_tags(parts.job), run_dir, lineage)
    except BaseException:
        backend.shutdown()  # no orphaned workers when the tracking store is unreachable
        raise
    if lineage is not None:
        Console(stderr=True).print(lineage.describe(), highlight=False, soft_wrap=True)
    return engine_of(parts, backend, tracker, run_dir, state_dir, start_round, system, privacy)


def new_run_dir(output_dir: Path, name: str) -> Path:
    """A fresh run folder under ``output_dir/runs``, named by the job and the time.

    Raises:
        ConfigError: the folder would lie outside ``output_dir/runs``; config validation refuses
            such names already, this guards a JobConfig made without it (``model_construct``).
    """
    runs = output_dir / "runs"
    run_dir = runs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    if run_dir.resolve().parent != runs.resolve():
        raise ConfigError([f"name: {name!r} would put the run folder outside {runs}; use a plain name"])
    return run_dir


def resume_lineage(tracker: Tracker, job: JobConfig, checkpoint: Checkpoint, branch: bool) -> Lineage | None:
    """Whether resuming continues the checkpoint's MLflow run or branches from it; None when the
    job logs to no MLflow store. Continuing holds the run folder's lock (``claim_run_folder``)
    until the run ends; the run is read only once the lock is held, so a driver that continued
    it meanwhile shows the rounds it logged."""
    if not isinstance(tracker, MlflowTracker):
        return None
    run_id = (checkpoint.run or {}).get("run_id")
    folder = checkpoint.path.absolute().parent
    run_dir = folder.parent if run_id is not None and folder.name == CHECKPOINTS_DIR and not branch else None
    held_by = claim_run_folder(run_dir) if run_dir is not None else None
    lineage: Lineage | None = None
    try:
        parent = tracker.parent_run(run_id) if run_id is not None else None
        lineage = decide(checkpoint, job.to_dict(), parent, tracker.experiment_id(), branch, held_by)
        return lineage
    finally:
        if run_dir is not None and not (lineage is not None and lineage.continues):
            release_run_folder(run_dir)  # branching after all: only if this driver took it


def open_parts(job: JobConfig) -> JobParts:
    """Opens the data (preparing it if needed), builds the plugins and the initial model, and
    draws the evaluation plan: every check that needs no worker and no MLflow run."""
    check_installed(job)
    store = with_validation_split(open_dataset(job.dataset.name, job.dataset.config), job)
    train_pool, heldout = split_population(store.num_clients, job.evaluation.heldout_fraction, job.seed)
    schedule = load_schedule(job, store, train_pool, heldout)
    transfer = open_transfer_stores(job, store)
    algorithm = build_algorithm(job)
    probes = build_probes(job)
    model = build_job_model(job, store.spec)
    params = P.clone(P.model_params(model))
    check_model_fits(model, store, job.model.name, job.dataset.name)  # not a failure in round 0
    check_plugin_model(job, model)  # FuseFL's split points
    client_models = check_model_groups(job, store)  # per-client architectures, FuseFL's alignment
    check_vectorize(job, algorithm, model, store)  # engine.vectorize: on, for a part that cannot
    if problems := sample_privacy_problems(job, model):  # DP-SGD: per-example gradients
        raise ConfigError(problems)
    check_training_options(dataset_options(job), store, job.engine.vectorize)  # augment, poison
    buffer_keys = frozenset(name for name, b in model.named_buffers() if name in params)
    del model
    info = RunInfo(
        len(train_pool),
        job.engine.cohort_size,
        job.engine.num_rounds,
        store.spec,
        job.seed,
        buffer_keys,
        has_central_test=bool(store.meta["has_central_test"]),
        model=job.model.to_dict(),
        dataset=job.dataset.to_dict(),
        client_models=client_models,
    )
    check_probes(probes, info)
    for warning in probes_never_due(job):  # valid, but surely not meant: said once, not refused
        Console(stderr=True).print(f"warning: {warning}", highlight=False, soft_wrap=True)
    plan = keep_personalizable(
        evaluation_plan(job, train_pool, heldout, transfer, has_personal_model(algorithm), store),
        store.num_examples("train"),
        store.num_examples("test"),
    )
    return JobParts(job, store, transfer, algorithm, probes, params, info, train_pool, schedule, plan)


def start_workers(parts: JobParts, state_dir: Path) -> Backend:
    """The workers (serial or Ray actors), each with the job's data and model loaded."""
    return start_sized_workers(parts, state_dir)[0]


def start_sized_workers(parts: JobParts, state_dir: Path) -> tuple[Backend, SizedResources]:
    """The workers, and their GPU share as measured first (``resources.gpus_per_worker: auto``)."""
    job, train_sizes = parts.job, parts.store.num_examples("train")
    setup = WorkerSetup(
        job.to_dict(),
        str(parts.store.path),
        str(state_dir),
        {name: str(s.path) for name, s in parts.transfer.items()},
        plugins=registry.travelling_entries(job_plugins(job)),
    )
    sized = sized_resources(
        job.resources,
        setup,
        lambda: probe_work(job, parts.algorithm, parts.params, parts.info, train_sizes, parts.train_pool),
    )
    if sized.note:
        Console(stderr=True).print(sized.note, highlight=False, soft_wrap=True)
    return make_backend(sized.with_share(job), setup, parts.store), sized


def engine_of(
    parts: JobParts,
    backend: Backend,
    tracker: Tracker,
    run_dir: Path,
    state_dir: Path,
    start_round: int = 0,
    system: SimulatedSystem | None = None,
    privacy: RunPrivacy | None = None,
) -> Engine[Any]:
    """The engine over a job's parts once their workers run: its verbs log to ``tracker``."""
    keep_round_memory()  # the rounds' model-sized temporaries reuse their pages, not fault them in
    target = parts.job.evaluation.time_to_target
    return Engine(
        job=parts.job,
        algorithm=parts.algorithm,
        store=parts.store,
        backend=backend,
        tracker=tracker,
        info=parts.info,
        run_dir=run_dir,
        state_dir=state_dir,
        plan=parts.plan,
        train_pool=parts.train_pool,
        probes=parts.probes,
        schedule=parts.schedule,
        start_round=start_round,
        system=system,
        targets=None if target is None else TimeToTarget(target),
        privacy=privacy,
        robust=RunRobust.of(parts.job, parts.train_pool),
    )


def check_installed(job: JobConfig) -> None:
    """Ray and MLflow are optional at import (GPU machines run without them); a job that needs
    one says so before any work starts."""
    needs = {"ray": job.resources.backend == "ray", "mlflow": job.tracking.enabled}
    missing = [name for name, needed in needs.items() if needed and importlib.util.find_spec(name) is None]
    if missing:
        raise ResourceError(
            f"this job needs {' and '.join(missing)}, which is not installed here: pip install "
            f"{' '.join(missing)}, or run with resources.backend=serial tracking.enabled=false"
        )


def load_schedule(
    job: JobConfig, store: ClientStore, train_pool: np.ndarray, heldout: np.ndarray
) -> CohortSchedule | None:
    """The fixed participation schedule, if any; checks the cohort size against the pool."""
    schedule = CohortSchedule.load(job.engine.schedule, store.num_clients) if job.engine.schedule else None
    if schedule is None and job.engine.cohort_size > len(train_pool):
        raise ConfigError(
            [
                f"engine.cohort_size: must be in 1..{len(train_pool)} (the number of "
                f"training clients), got {job.engine.cohort_size}"
            ]
        )
    if schedule is not None and len(heldout):
        trained = {c for cohort in schedule.cohorts for c in cohort} & set(heldout.tolist())
        if trained:
            raise ConfigError(
                [
                    f"engine.schedule: trains held-out clients {sorted(trained)[:5]}; held-out "
                    f"clients never train (evaluation.heldout_fraction)"
                ]
            )
    return schedule


def make_backend(job: JobConfig, setup: WorkerSetup, store: ClientStore) -> Backend:
    """The serial backend in-process, or Ray worker actors (Ray is imported only then)."""
    resources = job.resources
    if resources.backend == "serial":
        if resources.gpu_share > 0 and not torch.cuda.is_available():
            raise ResourceError(
                f"resources.gpus_per_worker={resources.gpus_per_worker} asks for a GPU, but this machine "
                "has no CUDA device; set resources.gpus_per_worker to 0 (CPU workers) or run where a GPU is"
            )
        device = "cuda" if resources.gpu_share > 0 else "cpu"
        serial_setup = replace(setup, device=device, num_threads=max(1, int(resources.cpus_per_worker)))
        return SerialBackend(serial_setup, num_workers=resources.num_workers or 1)
    from raysim.runtime.ray_backend import RayBackend

    return RayBackend(setup, resources, store.num_examples("train"))
