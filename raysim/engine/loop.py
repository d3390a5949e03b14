"""``run(job)``: build everything, run the round loop (or the plugin's own protocol), finish.

Usage:
    result = run(load_jobs("jobs/quickstart.yaml")[0])
    result.final["eval/central/accuracy"]
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from raysim import params as P
from raysim.algorithm import has_protocol
from raysim.config import JobConfig, explain
from raysim.data.prepare import open_dataset
from raysim.data.store import ClientStore
from raysim.engine.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from raysim.engine.evaluation import EvaluationPlan, evaluate_global, summarize_barrier
from raysim.engine.plots import learning_curve
from raysim.engine.progress import RoundProgress
from raysim.engine.tracking import MemoryTracker, MlflowTracker, Tracker
from raysim.errors import CheckpointError, ConfigError, NonFiniteError, ResourceError
from raysim.runtime.backend import Backend, RoundOutput, SerialBackend
from raysim.runtime.client_state import ClientStateStore
from raysim.runtime.worker import WorkerSetup, build_algorithm, build_job_model, raise_client_failure
from raysim.sampling import CohortSchedule, sample_cohort, sample_eval_clients, split_population
from raysim.types import Metrics, RunInfo, ServerState

log = logging.getLogger("raysim")


@dataclass
class RunResult:
    """What a finished run leaves: final state and metrics, the per-round history, the run id."""

    job: JobConfig
    state: ServerState
    final: Metrics
    history: list[tuple[int, Metrics]]
    run_id: str | None
    run_dir: Path
    seconds: float


@dataclass
class EngineServices:
    """The engine's pieces, handed to plugins whose ``protocol`` replaces the round loop."""

    job: JobConfig
    algorithm: Any
    store: ClientStore
    backend: Backend
    tracker: Tracker
    info: RunInfo
    run_dir: Path
    state_dir: Path
    schedule: CohortSchedule | None = None
    start_round: int = 0
    train_pool: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    plan: EvaluationPlan | None = None
    cohorts: list[list[int]] = field(default_factory=list)
    history: list[tuple[int, Metrics]] = field(default_factory=list)

    def cohort(self, round_num: int) -> np.ndarray:
        """This round's cohort: from the fixed schedule, else a pure function of (seed, round)."""
        if self.schedule is not None:
            cohort = self.schedule.cohort(round_num)
        else:  # held-out clients are not in the pool
            cohort = self.train_pool[
                sample_cohort(len(self.train_pool), self.job.engine.cohort_size, self.job.seed, round_num)
            ]
        self.cohorts.append([int(c) for c in cohort])
        return cohort

    def train_cohort(
        self, payload: Any, cohort: np.ndarray, round_num: int, measure_barrier: bool = False
    ) -> RoundOutput:
        """Trains a cohort and applies the failure policy (``engine.max_failed_clients``)."""
        output = self.backend.train_cohort(self.algorithm, payload, cohort, round_num, measure_barrier)
        if len(output.failures) > self.job.engine.max_failed_clients:
            raise_client_failure(output.failures[0], round_num)
        for failure in output.failures:
            log.warning(
                "round %d: client %d failed and was dropped: %r", round_num, failure.client_id, failure.error
            )
        refuse_nonfinite(output.aggregate, "the aggregate of the clients' updates", round_num)
        return output

    def evaluate(self, state: ServerState, round_num: int | None = None) -> Metrics:
        """The global model evaluated; personalization and transfer too when due."""
        return evaluate_global(
            self.backend,
            state.params,
            self.plan,
            round_num,
            personalize=round_num is not None and self.is_personalization_round(round_num),
        )

    def is_personalization_round(self, round_num: int) -> bool:
        config = self.job.evaluation.personalization
        every, last = (config.every if config else 0), self.job.engine.num_rounds - 1
        return round_num == last or (every > 0 and (round_num + 1) % every == 0)

    def is_eval_round(self, round_num: int) -> bool:
        every, last = self.job.engine.eval_every, self.job.engine.num_rounds - 1
        return round_num == last or (every > 0 and (round_num + 1) % every == 0)

    def is_barrier_round(self, round_num: int) -> bool:
        every = self.job.engine.barrier_every
        return every > 0 and (round_num + 1) % every == 0

    def client_server_barrier(self, state: ServerState, output: RoundOutput, round_num: int) -> Metrics:
        """FedFish's eq. 5: the new global model against each client's local model, on the
        client's own data of this round (the cohort's first two terms came from the workers)."""
        clients = np.array([int(m["client_id"]) for m in output.barrier], dtype=np.int64)
        after = self.backend.evaluate_clients(P.to_numpy(state.params), clients, "round", round_num)
        return summarize_barrier(output.barrier, after)

    def log(self, metrics: Metrics, round_num: int) -> None:
        self.history.append((round_num, metrics))
        self.tracker.log_metrics(metrics, step=round_num)

    def maybe_checkpoint(self, state: ServerState, round_num: int) -> None:
        every = self.job.engine.checkpoint_every
        if every > 0 and (round_num + 1) % every == 0:
            self.checkpoint(state, round_num, f"round_{round_num:05d}.pt")

    def checkpoint(self, state: ServerState, round_num: int, name: str) -> Path:
        """Server state plus a hard-link snapshot of the client state as of ``round_num``."""
        path = self.run_dir / "checkpoints" / name
        frozen = ClientStateStore(self.state_dir).snapshot(path.with_suffix(".client_state"), round_num)
        return save_checkpoint(
            path, state, round_num, self.job.to_dict(), None if frozen is None else str(frozen)
        )


def run(
    job: JobConfig,
    *,
    tracker: Tracker | None = None,
    resume_from: str | None = None,
    output_dir: str | Path = ".raysim",
) -> RunResult:
    """Runs one simulation end to end and returns its result."""
    start = time.perf_counter()
    services, state = build(job, tracker, resume_from, Path(output_dir))
    status = "FAILED"
    try:
        if has_protocol(services.algorithm):
            state = services.algorithm.protocol(services, state)
        else:
            state = round_loop(services, state)
        result = finish(services, state, time.perf_counter() - start)
        status = "FINISHED"  # only once the final model is checked and saved
        return result
    finally:
        services.backend.shutdown()
        services.tracker.finish(status)


def round_loop(s: EngineServices, state: ServerState) -> ServerState:
    """The default protocol: ``num_rounds`` identical rounds, evaluated and logged when due."""
    engine = s.job.engine
    with RoundProgress(s.job.name, engine.num_rounds, s.start_round, s.job.tracking.progress) as bar:
        for round_num in range(s.start_round, engine.num_rounds):
            state, metrics = run_round(s, state, round_num)
            if s.is_eval_round(round_num) or s.is_personalization_round(round_num):
                metrics |= s.evaluate(state, round_num)
            s.log(metrics, round_num)
            bar.update(round_num, metrics)
            s.maybe_checkpoint(state, round_num)
    return state


def run_round(s: EngineServices, state: ServerState, round_num: int) -> tuple[ServerState, Metrics]:
    """One round: sample, broadcast, train and fold on workers, update the server."""
    t0 = time.perf_counter()
    # 1. Sample the cohort: a pure function of (seed, round_num), or the fixed schedule.
    cohort = s.cohort(round_num)
    # 2. One payload for every client; each worker folds its clients into one partial.
    payload = s.algorithm.broadcast(state, round_num)
    measure_barrier = s.is_barrier_round(round_num)
    output = s.train_cohort(payload, cohort, round_num, measure_barrier)
    # 3. Merge happened in the backend; the server updates from the aggregate.
    state, metrics = s.algorithm.server_update(state, output.aggregate, round_num)
    refuse_nonfinite(state.params, "the new global model", round_num)
    metrics |= round_metrics(output, payload, len(cohort), time.perf_counter() - t0)
    # 4. When due, the client-server barrier: the new global model on each client's round data.
    if measure_barrier:
        metrics |= s.client_server_barrier(state, output, round_num)
    return state, metrics


_BOOKKEEPING = frozenset({"client_id", "weight", "seconds"})


def round_metrics(output: RoundOutput, payload: Any, cohort_size: int, seconds: float) -> Metrics:
    """Every client metric averaged over clients (weighted by their weight), and system metrics."""
    clients = output.client_metrics
    total = sum(m["weight"] for m in clients) or 1.0
    keys = sorted({k for m in clients for k in m} - _BOOKKEEPING)
    metrics = {key: sum(m[key] * m["weight"] for m in clients if key in m) / total for key in keys}
    busiest = max(output.worker_seconds, default=0.0)
    mean_busy = float(np.mean(output.worker_seconds)) if output.worker_seconds else 0.0
    return metrics | {
        "sys/round_s": seconds,
        "sys/clients_per_s": len(clients) / seconds if seconds > 0 else 0.0,
        "sys/bytes_down": float(P.num_bytes(payload.params) + P.num_bytes(payload.extra)) * cohort_size,
        "sys/bytes_up": float(output.bytes_up),
        "sys/failed_clients": float(len(output.failures)),  # dropped, non-finite ones included
        "sys/nonfinite_clients": float(sum(isinstance(f.error, NonFiniteError) for f in output.failures)),
        "sys/worker_imbalance": busiest / mean_busy if mean_busy > 0 else 1.0,
        "sys/worker_busy_s": busiest,  # the slowest worker's time training its clients
        "sys/driver_overhead_s": max(seconds - busiest, 0.0),  # broadcast, transfer, merge, server
        "sys/num_workers": float(len(output.worker_seconds)),
    }


def refuse_nonfinite(tree: Any, what: str, round_num: int) -> None:
    """Stops the run when ``tree`` holds NaN or infinity: it would poison every later round."""
    if not P.is_finite(tree):
        bad = P.nonfinite_names(tree)
        raise NonFiniteError(
            f"round {round_num}: {what} holds NaN or infinity in {bad[:5]}"
            f"{' ...' if len(bad) > 5 else ''}; every client's update was finite, so aggregation "
            f"or the server step made it (an overflow, a division by zero, or too large a "
            f"server learning rate)"
        )


def build(
    job: JobConfig, tracker: Tracker | None, resume_from: str | None, output_dir: Path
) -> tuple[EngineServices, ServerState]:
    """Builds every object of a run (here and nowhere else) and the starting server state.

    Everything that can be checked is checked before Ray workers or an MLflow run exist.
    """
    store = open_dataset(job.dataset.name, job.dataset.config)
    train_pool, heldout = split_population(store.num_clients, job.engine.heldout_fraction, job.seed)
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
                    f"clients never train (engine.heldout_fraction)"
                ]
            )
    transfer = open_transfer_stores(job, store)
    algorithm = build_algorithm(job)
    model = build_job_model(job, store.spec)
    params = P.clone(P.model_params(model))
    buffer_keys = frozenset(name for name, b in model.named_buffers() if name in params)
    del model
    info = RunInfo(
        num_clients=len(train_pool),
        cohort_size=job.engine.cohort_size,
        num_rounds=job.engine.num_rounds,
        spec=store.spec,
        seed=job.seed,
        buffer_keys=buffer_keys,
    )
    state, start_round, parent_state_dir = algorithm.init(params, info), 0, None
    if resume_from is not None:
        fresh = state
        state, last_round, _, parent_state_dir = load_checkpoint(resume_from)
        check_compatible(state, params, resume_from)
        check_same_shape(fresh, state, job.algorithm.name, resume_from)
        start_round = last_round + 1
    run_dir = output_dir / "runs" / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    state_dir = run_dir / "client_state"
    if parent_state_dir is not None:  # the checkpoint's frozen snapshot (load_checkpoint found it)
        ClientStateStore(state_dir).restore(parent_state_dir)
    setup = WorkerSetup(
        job=job.to_dict(),
        store_path=str(store.path),
        state_dir=str(state_dir),
        transfer_stores={name: str(s.path) for name, s in transfer.items()},
    )
    plan = EvaluationPlan(
        clients=train_pool[sample_eval_clients(len(train_pool), job.engine.eval_clients, job.seed)],
        heldout=heldout[sample_eval_clients(len(heldout), job.engine.heldout_eval_clients, job.seed)],
        personalization=job.evaluation.personalization,
        transfer={
            t.name: sample_eval_clients(transfer[t.name].num_clients, t.eval_clients, job.seed)
            for t in job.evaluation.transfer
        },
        personalize_transfer=frozenset(t.name for t in job.evaluation.transfer if t.personalize),
    )
    backend = make_backend(job, setup, store)
    try:
        tracker = tracker or (MlflowTracker(job.tracking) if job.tracking.enabled else MemoryTracker())
        tracker.start(job)
    except BaseException:
        backend.shutdown()  # no orphaned workers when the tracking store is unreachable
        raise
    services = EngineServices(
        job,
        algorithm,
        store,
        backend,
        tracker,
        info,
        run_dir,
        state_dir,
        schedule,
        start_round,
        train_pool,
        plan,
    )
    return services, state


def tokenizer_identity(store: ClientStore) -> str | None:
    """What a text store's token ids mean: a digest of its saved tokenizer (None: not text)."""
    import hashlib

    saved = store.meta.get("tokenizer")
    if not saved:
        return None
    digest = hashlib.sha256(json.dumps(saved["config"], sort_keys=True).encode())
    files = (
        [p for p in sorted((store.path / saved["file"]).rglob("*")) if p.is_file()]
        if saved.get("file") and (store.path / saved["file"]).is_dir()
        else [store.path / saved["file"]]
        if saved.get("file")
        else []
    )
    for path in files:  # a BPE trained per corpus differs in its merges, not its config
        digest.update(path.read_bytes())
    return digest.hexdigest()


def open_transfer_stores(job: JobConfig, store: ClientStore) -> dict[str, ClientStore]:
    """The evaluation-only datasets; each must look like the training data to the model."""
    from raysim import registry

    stores = {}
    for i, transfer in enumerate(job.evaluation.transfer):
        options = {k: v for k, v in transfer.dataset.items() if k != "name"}
        entry = registry.get("dataset", str(transfer.dataset.get("name", "")))
        try:
            config = entry.config.model_validate(options)
        except ValidationError as exc:
            raise ConfigError(explain(exc, entry.config, f"evaluation.transfer[{i}].dataset.")) from None
        other = open_dataset(transfer.dataset["name"], config)
        if (other.spec.task, other.spec.input_shape, other.spec.num_classes) != (
            store.spec.task,
            store.spec.input_shape,
            store.spec.num_classes,
        ):
            raise ConfigError(
                [
                    f"evaluation.transfer[{i}]: {transfer.name!r} holds {other.spec}, the "
                    f"model is built for {store.spec}"
                ]
            )
        if tokenizer_identity(other) != tokenizer_identity(store):
            raise ConfigError(
                [
                    f"evaluation.transfer[{i}]: {transfer.name!r} is tokenized differently "
                    f"from the training data (the same ids would mean other words); give "
                    f"both the same tokenizer, e.g. tokenizer: {{kind: hf, name_or_path: ...}}"
                ]
            )
        stores[transfer.name] = other
    return stores


def check_same_shape(fresh: ServerState, saved: ServerState, algorithm: str, path: str) -> None:
    """A checkpoint must hold the plugin state this job's algorithm keeps (branching between
    algorithms of one family, FedAvg to FedAdam say, is fine)."""
    if set(fresh.extra) != set(saved.extra):
        raise CheckpointError(
            f"{path} holds server state {sorted(saved.extra)}; algorithm "
            f"{algorithm!r} keeps {sorted(fresh.extra)}: it was written by "
            f"another kind of algorithm"
        )


def make_backend(job: JobConfig, setup: WorkerSetup, store: ClientStore) -> Backend:
    """The serial backend in-process, or Ray worker actors (Ray is imported only then)."""
    resources = job.resources
    if resources.backend == "serial":
        if resources.gpus_per_worker > 0 and not torch.cuda.is_available():
            raise ResourceError("resources.gpus_per_worker > 0 but this machine has no CUDA device")
        serial_setup = replace(
            setup,
            device="cuda" if resources.gpus_per_worker > 0 else "cpu",
            num_threads=max(1, int(resources.cpus_per_worker)),
        )
        return SerialBackend(serial_setup, num_workers=resources.num_workers or 1)
    from raysim.runtime.ray_backend import RayBackend

    return RayBackend(setup, resources, store.num_examples("train"))


def finish(s: EngineServices, state: ServerState, seconds: float) -> RunResult:
    """Final checkpoint, cohort schedule and learning curve as artifacts; the result."""
    last_round = s.history[-1][0] if s.history else s.start_round - 1
    refuse_nonfinite(state.params, "the final global model", last_round)  # protocols too
    s.run_dir.mkdir(parents=True, exist_ok=True)
    title = f"{s.job.name}: {s.job.algorithm.name}, {s.job.model.name} on {s.job.dataset.name}"
    artifacts = [learning_curve(s.history, title, s.run_dir / "learning_curve.png")]
    CohortSchedule(s.cohorts, s.store.num_clients, s.start_round).save(s.run_dir / "cohorts.json")
    artifacts.append(s.run_dir / "cohorts.json")
    final_checkpoint = s.checkpoint(state, last_round, "final.pt")  # always: a run can resume
    if s.job.tracking.log_checkpoint:
        artifacts.append(final_checkpoint)
    for path in artifacts:
        s.tracker.log_artifact(path)
    final: Metrics = {}
    for _, metrics in s.history:
        final |= metrics
    return RunResult(s.job, state, final, s.history, s.tracker.run_id, s.run_dir, seconds)
