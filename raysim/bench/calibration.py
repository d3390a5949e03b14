"""A rough wall time for a job, from how long one local step of its model takes on this machine:
the estimate ``raysim run --dry-run`` prints.

The step time is measured once per machine, model section and batch shape, and cached in
``<raysim home>/calibration.json``: the job's model, a batch of ``batch_size`` rows of its store
(rows repeated when the store has fewer), ``WARMUP`` untimed steps, then the fastest of ``STEPS``
timed steps of forward, task loss, backward and an SGD step, on the CPU, in this process, with
as many torch threads as a worker gets (``resources.cpus_per_worker``). A run then takes about
``rounds x cohort x local steps x step time / workers training at once`` plus ``STARTUP_S``.

How rough: it counts local SGD only. Evaluation, a plugin's extra server work (distillation,
data-free synthesis, Fisher passes, FuseFL's fusion) and extra local work (LSS's or FedGuCci's
regularizers, SAM's second pass) are not in it, nor a machine shared with other work; expect the
right order of magnitude, and a real run up to a few times longer. Delete the file to measure again.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.plugin_defaults import local_section
from raysim.runtime.builders import build_job_model
from raysim.train.local import LocalTrainConfig

WARMUP, STEPS = 2, 5
STARTUP_S = 5.0  # a run's start: data opened, workers and the MLflow run started (docs/performance.md)
CACHE_FILE = "calibration.json"


@dataclass(frozen=True)
class Estimate:
    """A run's estimated seconds, and the measured step it comes from."""

    seconds: float
    step_s: float  # one local step of the model on one batch
    steps: int  # local steps of the whole run
    basis: str  # the model and batch shape the step was measured on


def estimate_run(job: JobConfig, store: ClientStore, home: str | Path) -> Estimate | None:
    """The job's estimated wall time; None for a plugin without a ``local`` section of local SGD."""
    local = local_section(job.algorithm.config)
    if not isinstance(local, LocalTrainConfig):
        return None
    sizes = store.num_examples("train")
    if job.engine.max_client_examples is not None:
        sizes = np.minimum(sizes, job.engine.max_client_examples)
    per_client = math.ceil(float(sizes.mean()) / local.batch_size) * local.epochs if len(sizes) else 0
    if local.max_steps is not None:
        per_client = min(per_client, local.max_steps)
    steps = job.engine.num_rounds * job.engine.clients_per_round * per_client
    shape = (local.batch_size, *store.spec.input_shape)
    basis = f"{job.model.name} on a batch of {'x'.join(map(str, shape))}"
    step_s = step_seconds(job, store, local.batch_size, Path(home) / CACHE_FILE)
    return Estimate(STARTUP_S + steps * step_s / parallel(job), step_s, steps, basis)


def parallel(job: JobConfig) -> int:
    """Workers that train at once: Ray's, as many as this machine's cores hold; serial's one."""
    resources = job.resources
    if resources.backend != "ray":
        return 1
    cores = (os.cpu_count() or 1) // threads(job)
    return max(1, min(resources.num_workers or cores, cores))


def threads(job: JobConfig) -> int:
    return max(1, int(job.resources.cpus_per_worker))


def step_seconds(job: JobConfig, store: ClientStore, batch_size: int, cache: Path) -> float:
    """One local step's seconds: from the cache, else measured now and cached."""
    key = json.dumps(
        [platform.node(), platform.machine(), os.cpu_count(), torch.__version__, job.model.to_dict()]
        + [batch_size, list(store.spec.input_shape), store.spec.task, threads(job)],
        sort_keys=True,
    )
    known = _read(cache)
    if key not in known:
        known[key] = measure_step(job, store, batch_size)
        _write(cache, known)
    return float(known[key])


def measure_step(job: JobConfig, store: ClientStore, batch_size: int) -> float:
    """The fewest seconds of one SGD step of the job's model on a batch shaped like its data (the
    fastest step is the machine's; slower ones measure other work sharing it)."""
    model = build_job_model(job, store.spec)
    rows = store.first_rows(batch_size).arrays
    take = np.resize(np.arange(len(rows["x"])), batch_size)  # repeats rows of a small store
    x = torch.from_numpy(rows["x"][take].copy())
    y = torch.from_numpy(rows["y"][take].copy()) if "y" in rows else None
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    times, before = [], torch.get_num_threads()
    torch.set_num_threads(threads(job))
    with torch.random.fork_rng(devices=[]):
        for i in range(WARMUP + STEPS):
            start = time.perf_counter()
            optimizer.zero_grad()
            _loss(model(x), x, y, store.spec.task).backward()
            optimizer.step()
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
    torch.set_num_threads(before)
    return min(times)


def _loss(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None, task: str) -> torch.Tensor:
    """The task's loss, for its cost only: the labels' values do not matter here."""
    if task == "causal_lm":
        return F.cross_entropy(out[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    if task == "regression" or y is None:
        return out.float().pow(2).mean()
    return F.cross_entropy(out, y.long())


def _read(cache: Path) -> dict[str, float]:
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):  # none yet, or a torn one: measure again
        return {}
    return known if isinstance(known, dict) else {}


def _write(cache: Path, known: dict[str, float]) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(cache)
    except OSError:  # an estimate is not worth failing the dry run for
        pass
