"""``resources.gpus_per_worker: auto``: one worker's training measured on a GPU before the pool
starts, and the share of a card that packs as many such workers as fit (``memory.gpu_share``).

The probe builds a worker as the backends build theirs (``ClientTrainer``), alone on a whole card,
and trains the first round's payload on the population's largest client, or, where the worker
trains in chunks (``engine.vectorize``), on one chunk of the largest clients (with
``engine.vectorize_chunk: auto``, the probe chunks ``ChunkSize`` measures, then the chunk it
chooses). The largest, not the first sampled: the share must hold every client a worker meets.
A worker's peak is the CUDA allocator's peak plus what the process holds outside the allocator
(the CUDA context and loaded kernels: the card's used memory less the allocator's reserve, so
other processes on the card count too, which only makes the share smaller).

On Ray the probe runs as a task with one whole GPU (``ray_placement.probe_gpu_worker``), on a GPU
node, not the driver; ``gpu_auto.sized_resources`` chooses the probe or, under the serial backend,
the whole card.

Usage:
    work = probe_work(job, algorithm, params, info, num_examples, train_pool)
    peak = measure_worker(setup, work)          # on a process with the whole card
    share = share_of(peak)                      # resources.gpus_per_worker: 1/n
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from raysim.algorithm import AnyAlgorithm
from raysim.config import JobConfig
from raysim.errors import ResourceError
from raysim.plugin_defaults import first_payload, fresh_state
from raysim.runtime.chunks import ChunkSize, is_out_of_memory
from raysim.runtime.memory import SAFETY, MiB, gpu_share, workers_per_gpu
from raysim.runtime.wire import WorkerSetup
from raysim.sampling import sample_cohort
from raysim.services import RoundOptions
from raysim.types import Params, Payload, RunInfo

RAY_UNITS = 10_000  # Ray counts a fractional resource in 1/10,000ths of one, rounding to nearest


@dataclass(frozen=True)
class ProbeWork:
    """What the probe trains: the first round's payload and the clients of one chunk (or one);
    and what the layout's candidates train (``layout_timing``): a cohort drawn from the pool,
    with the plugin that merges its partials (the driver's: never shipped to the probe)."""

    payload: Payload
    client_ids: list[int]
    cohort: tuple[int, ...] = ()
    algorithm: Any = field(default=None, compare=False, repr=False)
    num_examples: Any = field(default=None, compare=False, repr=False)  # the train split's, by client

    def shipped(self) -> ProbeWork:
        """What the probe's task needs: the payload and its clients."""
        return replace(self, cohort=(), algorithm=None, num_examples=None)


@dataclass(frozen=True)
class WorkerPeak:
    """One worker's training on a whole GPU, measured."""

    allocated_bytes: float  # the CUDA allocator's peak: model, payload, the update's tensors
    outside_bytes: float  # held outside the allocator: the CUDA context, loaded kernels
    device_bytes: float  # the card's memory
    device_name: str
    clients: int  # trained at once: 1, or a chunk
    # The least a worker needs (its context, the model and the chunk it cannot shrink: one client
    # under auto chunks); 0.0: its peak, ``bytes``.
    least_bytes: float = 0.0
    vectorizes: bool = False  # the worker trains in chunks

    @property
    def bytes(self) -> float:
        return self.allocated_bytes + self.outside_bytes

    @property
    def least(self) -> float:
        return self.least_bytes or self.bytes


def probe_work(
    job: JobConfig,
    algorithm: AnyAlgorithm[Any],
    params: Params,
    info: RunInfo,
    num_examples: np.ndarray,
    train_pool: np.ndarray,
) -> ProbeWork:
    """The round-0 payload of the initial model and the largest clients of the training pool, as
    many as one chunk holds (one when the job trains clients one by one)."""
    payload = first_payload(algorithm, fresh_state(algorithm, params, info), info)
    engine = job.engine
    count = 1
    if engine.vectorize != "off":
        auto = ChunkSize.PROBE_CLIENTS * ChunkSize.PROBE_CHUNKS  # ChunkSize measures these, then sizes
        count = auto if engine.vectorize_chunk == "auto" else engine.vectorize_chunk
    count = max(1, min(count, engine.cohort_size, len(train_pool)))
    sizes = num_examples[train_pool]
    largest = np.argsort(-sizes, kind="stable")[:count]  # ties: the lower client id first
    drawn = sample_cohort(len(train_pool), min(engine.cohort_size, len(train_pool)), job.seed, 0)
    cohort = tuple(int(c) for c in train_pool[drawn])  # what the layouts' trial rounds train
    return ProbeWork(payload, [int(c) for c in train_pool[largest]], cohort, algorithm, num_examples)


def measure_worker(setup: WorkerSetup, work: ProbeWork) -> WorkerPeak:
    """Builds a worker on this process's GPU, trains ``work`` on it, and reads its peak memory.
    Its client state goes to a scratch folder: the probe leaves nothing in the run.

    Raises:
        ResourceError: no CUDA device here; or one client does not fit the whole card.
    """
    from raysim.runtime.worker import ClientTrainer  # the worker's imports, only in the probe

    if not torch.cuda.is_available():
        raise ResourceError(no_gpu("this process has none"))
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as scratch:
        trainer = ClientTrainer(replace(setup, device="cuda", gpu_memory_fraction=None, state_dir=scratch))
        ids = work.client_ids if trainer.vectorizes else work.client_ids[:1]
        torch.cuda.reset_peak_memory_stats(device)
        report = trainer.train(work.payload, list(enumerate(ids)), 0, RoundOptions())
        torch.cuda.synchronize(device)
        allocated, clients = float(torch.cuda.max_memory_allocated(device)), len(ids)
        chunks, least = trainer.chunk_size, 0.0
        resident = torch.cuda.memory_allocated(device)  # the model and what it keeps
        if trainer.vectorizes and chunks.bytes_per_client > 0:  # auto chunks: the one ChunkSize chose
            clients = chunks.size or 1
            allocated = max(allocated, resident + clients * chunks.bytes_per_client)
            least = resident + chunks.bytes_per_client
        free, total = torch.cuda.mem_get_info(device)
        outside = max(0.0, total - free - torch.cuda.memory_reserved(device))
        name = torch.cuda.get_device_name(device)
    for failure in report.failures:
        if is_out_of_memory(failure.error) or isinstance(failure.error, MemoryError):
            raise ResourceError(
                f"resources.gpus_per_worker: auto: client {failure.client_id} does not fit even "
                f"alone on the whole {name} ({total / MiB:,.0f} MiB): {failure.error}; lower the "
                f"batch size or engine.vectorize_chunk, or use a larger card"
            )
        raise failure.error  # the plugin's own failure: round 0 would meet it too
    peak = WorkerPeak(allocated, float(outside), float(total), name, clients, least and least + outside)
    configured = setup.job.get("engine", {}).get("vectorize_chunk", "auto")
    if trainer.vectorizes and configured != "auto":
        if (error := chunk_fit_error(int(configured), chunks.size or 1, peak)) is not None:
            raise ResourceError(error)
    return replace(peak, vectorizes=trainer.vectorizes)


def chunk_fit_error(configured: int, kept: int, peak: WorkerPeak) -> str | None:
    """Why a configured ``engine.vectorize_chunk`` cannot train on the whole card the probe
    measured (it ran out of memory and was halved to ``kept``, or it peaks past ``SAFETY`` of
    the card), with the chunk that fits; None when it fits."""
    card = f"the whole {peak.device_name} ({peak.device_bytes / MiB:,.0f} MiB)"
    if kept < configured:
        return (
            f"engine.vectorize_chunk: {configured} clients at once ran out of memory on {card}, "
            f"{kept} fit; set engine.vectorize_chunk to {kept} or auto"
        )
    if peak.bytes > SAFETY * peak.device_bytes:
        fits = max(1, int(configured * SAFETY * peak.device_bytes // peak.bytes))
        return (
            f"engine.vectorize_chunk: {configured} clients at once peak at {peak.bytes / MiB:,.0f} MiB, "
            f"more than {SAFETY:.0%} of {card}; set engine.vectorize_chunk to {fits} or auto"
        )
    return None


def share_of(peak: WorkerPeak) -> float:
    """The ``resources.gpus_per_worker`` that packs as many such workers on a card as fit,
    rounded down to what Ray counts, so that n of them fit a card in Ray's arithmetic too (past
    about 100 workers a card, the rounding lets Ray place up to 1% more of them than measured).

    Raises:
        ResourceError: one worker's peak does not fit the card, with the numbers and the fix.
    """
    try:
        per_card = round(1 / gpu_share(peak.bytes, peak.device_bytes))  # the share is 1/n
    except MemoryError as exc:
        raise ResourceError(f"resources.gpus_per_worker: auto: {exc}") from None
    return max(1, RAY_UNITS // per_card) / RAY_UNITS


def sizing_tags(peak: WorkerPeak, share: float) -> dict[str, str]:
    """The run's tags for what was measured and chosen."""
    return {
        "gpus_per_worker": f"{share:g}",
        "gpu_worker_peak_mib": f"{peak.bytes / MiB:.0f}",
        "gpu_worker_allocated_mib": f"{peak.allocated_bytes / MiB:.0f}",
        "gpu_workers_per_card": str(workers_per_gpu(peak.bytes, peak.device_bytes)),
    }


def describe(peak: WorkerPeak, share: float) -> str:
    """The console line: the measured peak, its parts and the chosen share."""
    what = "one client" if peak.clients == 1 else f"a chunk of {peak.clients} clients"
    return (
        f"resources.gpus_per_worker: auto: {what} peaks at {peak.bytes / MiB:,.0f} MiB "
        f"({peak.allocated_bytes / MiB:,.0f} allocated, {peak.outside_bytes / MiB:,.0f} CUDA context) "
        f"on a {peak.device_name} of {peak.device_bytes / MiB:,.0f} MiB: "
        f"{workers_per_gpu(peak.bytes, peak.device_bytes)} workers per GPU, {share:g} each"
    )


def no_gpu(where: str) -> str:
    """The error of ``auto`` where no GPU is: ``where`` says where none was found."""
    return (
        f"resources.gpus_per_worker: auto measures a worker on a GPU, and {where}; "
        f"set resources.gpus_per_worker to 0 (CPU workers) or run where a GPU is"
    )
