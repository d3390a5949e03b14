"""A rough wall time for a job, from how long one local step, one forward pass and one client's
fixed work take for its model on this machine: the estimate ``raysim run --dry-run`` prints.

All three are measured once per machine, model section and batch shapes, and cached in
``<raysim home>/calibration.json``: the job's model on a batch of ``batch_size`` rows of its store
(rows repeated when the store has fewer), ``WARMUP`` untimed steps, then the median of ``STEPS``
timed steps of forward, task loss, backward and an SGD step; the median of ``STEPS`` forward
passes on a batch of ``evaluation.batch_size`` rows; and the median of ``STEPS`` clients' work
outside their steps (``client_seconds``); on the CPU, in this process, with as many torch threads
as a worker gets (``resources.cpus_per_worker``). A run then takes about

- training: rounds x cohort x local steps x step time / workers training at once (Ray's workers,
  at most as many as this machine's cores hold; serial's one);
- evaluation: evaluated rounds (every ``evaluation.every``-th, the last, and the start with
  ``at_start``) x examples evaluated (the central test set and the evaluated clients' test splits)
  x a forward pass's time per example;
- overhead: ``STARTUP_S`` and, with Ray, ``RAY_START_S`` once; ``ROUND_S`` a round; and a
  client's fixed work, measured, for each client trained, shared by the workers. Ray adds nothing
  per client: a worker takes its share of a round's clients in one call and returns one partial.

How rough: a plugin's extra server work (distillation, data-free synthesis, Fisher passes,
FuseFL's fusion), extra local work (LSS's or FedGuCci's regularizers, SAM's second pass),
personalization and transfer evaluation are not in it, and a machine shared with other work runs
slower; expect a real run within about 1.5x on a quiet machine. Delete the file to measure again.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.plugin_defaults import local_section
from raysim.runtime.builders import build_job_model
from raysim.runtime.device_reads import check_finite_result
from raysim.train.batching import to_tensors
from raysim.train.local import LocalTrainConfig
from raysim.types import ClientResult, Params

WARMUP, STEPS = 2, 7
# From jobs/quickstart.yaml's fedavg on 2 shared CPU cores (2026-12-06): 6.7 s before the first round
# serially, 21-26 s with Ray's 2 workers; its rounds came within 1.3x of the estimate (docs/performance.md).
STARTUP_S = 7.0  # the process's imports, data opened, the MLflow run started
RAY_START_S = 15.0  # Ray's processes and workers started, once a run
ROUND_S = {"serial": 0.05, "ray": 0.1}  # a round outside the workers: merge, server step, logging
CACHE_FILE = "calibration.json"
CACHE_VERSION = 2  # raise it when ``Costs`` or what they time changes: older entries are measured again


@dataclass(frozen=True)
class Costs:
    """One measured local SGD step, one example's share of a forward pass (evaluation), and one
    client's fixed work outside its steps."""

    step_s: float
    forward_s: float
    client_s: float


@dataclass(frozen=True)
class Estimate:
    """A run's estimated seconds, its parts, and the measured costs they come from."""

    training_s: float
    evaluation_s: float
    overhead_s: float
    costs: Costs
    steps: int  # local steps of the whole run
    examples: int  # examples a whole run's evaluations look at
    basis: str  # the model and batch shape the step was measured on

    @property
    def seconds(self) -> float:
        return self.training_s + self.evaluation_s + self.overhead_s


def estimate_run(job: JobConfig, store: ClientStore, home: str | Path) -> Estimate | None:
    """The job's estimated wall time, its costs measured here or cached under ``home``; None for a
    plugin without a ``local`` section of local SGD."""
    local = local_section(job.algorithm.config)
    if not isinstance(local, LocalTrainConfig):
        return None
    return estimate(job, store, local, measured_costs(job, store, local.batch_size, Path(home) / CACHE_FILE))


def estimate(job: JobConfig, store: ClientStore, local: LocalTrainConfig, costs: Costs) -> Estimate:
    """The job's estimated wall time from these costs: training, evaluation and overhead."""
    sizes = store.num_examples("train")
    if job.engine.max_client_examples is not None:
        sizes = np.minimum(sizes, job.engine.max_client_examples)
    per_client = math.ceil(float(sizes.mean()) / local.batch_size) * local.epochs if len(sizes) else 0
    if local.max_steps is not None:
        per_client = min(per_client, local.max_steps)
    rounds, cohort, workers = job.engine.num_rounds, job.engine.clients_per_round, parallel(job)
    steps = rounds * cohort * per_client
    examples = evaluation_rounds(job) * evaluated_examples(job, store)
    shape = (local.batch_size, *store.spec.input_shape)
    basis = f"{job.model.name} on a batch of {'x'.join(map(str, shape))}"
    backend = job.resources.backend
    overhead = STARTUP_S + (RAY_START_S if backend == "ray" else 0.0)
    overhead += rounds * (ROUND_S.get(backend, ROUND_S["ray"]) + cohort * costs.client_s / workers)
    training = steps * costs.step_s / workers
    return Estimate(training, examples * costs.forward_s, overhead, costs, steps, examples, basis)


def evaluation_rounds(job: JobConfig) -> int:
    """Evaluations of a run: after every ``every``-th round, after the last, and at the start."""
    rounds, every = job.engine.num_rounds, job.evaluation.every
    due = rounds // every if every else 0
    last = 0 if every and rounds % every == 0 else 1  # the last round is due already
    return due + last + int(job.evaluation.at_start)


def evaluated_examples(job: JobConfig, store: ClientStore) -> int:
    """Examples one evaluation looks at: the central test set and the test splits of the
    evaluated training and held-out clients (as many as ``evaluation.clients`` and
    ``heldout_clients`` say, of their mean size)."""
    evaluation = job.evaluation
    tests = store.num_examples("test")
    heldout = round(store.num_clients * evaluation.heldout_fraction)
    trained = store.num_clients - heldout
    clients = min(evaluation.clients or trained, trained) + min(
        evaluation.heldout_clients or heldout, heldout
    )
    central = store.central_test()
    mean = float(tests.mean()) if len(tests) else 0.0
    return (len(central.arrays["x"]) if central is not None else 0) + round(clients * mean)


def parallel(job: JobConfig) -> int:
    """Workers that train at once: Ray's, as many as this machine's cores hold; serial's one."""
    resources = job.resources
    if resources.backend != "ray":
        return 1
    cores = (os.cpu_count() or 1) // threads(job)
    return max(1, min(resources.num_workers or cores, cores))


def threads(job: JobConfig) -> int:
    return max(1, int(job.resources.cpus_per_worker))


def measured_costs(job: JobConfig, store: ClientStore, batch_size: int, cache: Path) -> Costs:
    """The job's costs on this machine: from the cache, else measured now and cached. Both backends
    run the same worker code, so the worker's threads stand for the backend in the key."""
    eval_batch = job.evaluation.batch_size
    key = json.dumps(
        [CACHE_VERSION, platform.node(), platform.machine(), os.cpu_count(), torch.__version__]
        + [job.model.to_dict(), batch_size, eval_batch, list(store.spec.input_shape), store.spec.task]
        + [threads(job)],
        sort_keys=True,
    )
    known = _read(cache)
    costs = _costs_of(known.get(key))
    if costs is None:
        costs = measure(job, store, batch_size, eval_batch)
        known[key] = asdict(costs)
        _write(cache, known)
    return costs


def _costs_of(entry: object) -> Costs | None:
    """A cache entry's costs; None for none or one that lacks a cost (measure again)."""
    names = [f.name for f in fields(Costs)]
    if not isinstance(entry, dict) or not all(isinstance(entry.get(n), (int, float)) for n in names):
        return None
    return Costs(**{n: float(entry[n]) for n in names})


def measure(job: JobConfig, store: ClientStore, batch_size: int, eval_batch: int) -> Costs:
    """The job's model's step, forward pass and client costs, with a worker's torch threads."""
    model = build_job_model(job, store.spec)
    before = torch.get_num_threads()
    torch.set_num_threads(threads(job))
    try:
        with torch.random.fork_rng(devices=[]):
            step_s = step_seconds(model, store, batch_size)
            forward_s = forward_seconds(model, store, eval_batch)
            client_s = client_seconds(model, store)
    finally:
        torch.set_num_threads(before)
    return Costs(step_s, forward_s, client_s)


def step_seconds(model: nn.Module, store: ClientStore, batch_size: int) -> float:
    """The median seconds of one SGD step of the model on a batch shaped like the store's data (a
    median, not the fastest: a run meets the machine as it is, other work included)."""
    x, y = _batch(store, batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        _loss(model(x), x, y, store.spec.task).backward()
        optimizer.step()

    return _median_seconds(step)


def forward_seconds(model: nn.Module, store: ClientStore, eval_batch: int) -> float:
    """One example's share of the median forward pass on an evaluation batch."""
    x, _ = _batch(store, eval_batch)
    with torch.no_grad():
        return _median_seconds(lambda: model(x)) / eval_batch


def client_seconds(model: nn.Module, store: ClientStore) -> float:
    """The median seconds a worker spends on a client outside its local steps
    (``raysim.runtime.worker``): the global weights loaded into its resident model, the client's
    examples read and made tensors, its update (global - local) computed and checked finite, and
    that folded into the round's float64 sum. All but the read grow with the model."""
    global_params = P.clone(P.model_params(model))
    aggregator: WeightedMean[Params] = WeightedMean()
    partial = aggregator.zero()
    clients = itertools.cycle(range(store.num_clients))  # a new client each time, as a round reads

    def client() -> None:
        nonlocal partial
        P.load_into(model, global_params)
        to_tensors(store.client_data(next(clients)))
        result: ClientResult[Params, None] = ClientResult(
            P.delta(global_params, P.model_params(model)), weight=1.0
        )
        check_finite_result(result)
        partial = aggregator.add(partial, 0, result)

    return _median_seconds(client)


def _batch(store: ClientStore, size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows = store.first_rows(size).arrays
    take = np.resize(np.arange(len(rows["x"])), size)  # repeats rows of a small store
    y = torch.from_numpy(rows["y"][take].copy()) if "y" in rows else None
    return torch.from_numpy(rows["x"][take].copy()), y


def _median_seconds(work: Callable[[], object]) -> float:
    """The median of ``STEPS`` timed calls of ``work``, after ``WARMUP`` untimed ones."""
    times = []
    for i in range(WARMUP + STEPS):
        start = time.perf_counter()
        work()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _loss(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None, task: str) -> torch.Tensor:
    """The task's loss, for its cost only: the labels' values do not matter here."""
    if task == "causal_lm":
        return F.cross_entropy(out[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    if task == "regression" or y is None:
        return out.float().pow(2).mean()
    return F.cross_entropy(out, y.long())


def _read(cache: Path) -> dict[str, Any]:
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):  # none yet, or a torn one: measure again
        return {}
    return known if isinstance(known, dict) else {}


def _write(cache: Path, known: dict[str, Any]) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(cache)
    except OSError:  # an estimate is not worth failing the dry run for
        pass
