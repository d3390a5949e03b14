"""Vectorized rounds in the worker: whether a job's client updates train in chunks, and a round's
clients trained chunk by chunk (``engine.vectorize``, ``engine.vectorize_chunk``).

A round vectorizes when ``engine.vectorize`` is ``auto`` or ``on``, the plugin has a
``vectorized_update`` (``raysim.algorithm.vectorizes``), the model holds no randomness it cannot
draw per client (``raysim.train.vectorizable.vectorization_blocker``), the job sets no
``privacy.sample`` (DP-SGD's per-example gradients run in the sequential trainer) and the round
measures no client with a probe nor keeps the clients' local models (both need each client's model,
which a chunk never materialises); otherwise it runs the sequential loop. ``on`` refuses before training a
job whose plugin, model or probes cannot vectorize.

Usage:
    check_vectorize(job, algorithm, model, store)   # the driver, before any worker starts
    worker_vectorizes(job, algorithm, model, device, store)   # a worker, once
    size = ChunkSize.for_worker(job, model, device, gpu_fraction)   # a worker, once
    chunks = ChunkResults(train_chunk, client_ids, size)
    result, seconds = chunks.result(client_id)  # trains its chunk the first time
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Literal

import numpy as np
import torch
from torch import nn

from raysim.algorithm import AnyAlgorithm, vectorizes
from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.errors import ConfigError
from raysim.runtime.memory import (
    MiB,
    PeakMemory,
    check_slice,
    chunk_that_fits,
    cpu_memory_share,
    keep_freed_memory,
    memory_budget,
)
from raysim.train.vectorizable import vectorization_blocker
from raysim.types import ClientResult

log = logging.getLogger("raysim")


def vectorize_blocker(
    algorithm: AnyAlgorithm, model: nn.Module, algorithm_name: str, store: ClientStore | None = None
) -> str | None:
    """What keeps this plugin and model from training clients in chunks (None: nothing); with the
    store, the model's forward runs on its first rows too (``vectorization_blocker``)."""
    if not vectorizes(algorithm):
        return f"the algorithm {algorithm_name!r} has no vectorized_update (it trains one client at a time)"
    if (blocker := vectorization_blocker(model, example_rows(store, model))) is not None:
        return f"the model: {blocker}"
    return None


def example_rows(store: ClientStore | None, model: nn.Module) -> torch.Tensor | None:
    """Two input rows from the store's first (one repeated if it holds one), on the model's device."""
    x = store.first_rows(2).arrays["x"] if store is not None else np.zeros((0,))
    if len(x) == 0:
        return None
    device = next(iter(model.parameters())).device
    return torch.from_numpy(np.resize(x, (2, *x.shape[1:]))).to(device)


def worker_vectorizes(
    job: JobConfig, algorithm: AnyAlgorithm, model: nn.Module, device: torch.device, store: ClientStore
) -> bool:
    """Whether a worker trains its rounds in chunks: ``engine.vectorize`` is not off, no
    ``privacy.sample`` (DP-SGD trains one client at a time) and neither plugin nor model is in the
    way. On a CPU the worker then keeps freed memory for reuse."""
    if job.privacy is not None and job.privacy.sample is not None:  # auto: sequential; on is refused
        return False
    name = job.algorithm.name
    vectorizes = job.engine.vectorize != "off" and vectorize_blocker(algorithm, model, name, store) is None
    if vectorizes and device.type == "cpu":
        keep_freed_memory()
    return vectorizes


def check_vectorize(job: JobConfig, algorithm: AnyAlgorithm, model: nn.Module, store: ClientStore) -> None:
    """Refuses ``engine.vectorize: on`` for a job that cannot vectorize, naming the part.

    Raises:
        ConfigError: naming the plugin, the model's module or the probes in the way.
    """
    if job.engine.vectorize != "on":
        return
    blocker = vectorize_blocker(algorithm, model, job.algorithm.name, store)
    if blocker is None and job.evaluation.probes:
        blocker = "evaluation.probes measure each client's own model, which a chunk never holds"
    if blocker is not None:
        raise ConfigError([f"engine.vectorize: on, but {blocker}; set engine.vectorize to auto or off"])


class ChunkSize:
    """How many clients a worker trains at once, kept for the worker's life.

    An integer ``engine.vectorize_chunk`` is used as it is. ``auto`` trains the first
    ``PROBE_CHUNKS`` chunks with ``PROBE_CLIENTS`` clients each and measures the peak memory each
    adds (``raysim.runtime.memory``); then, at the least bytes a client was measured at, it takes
    the most clients that fill at most ``SAFETY`` of the worker's budget, up to ``AUTO_LIMIT``.
    Either way, a chunk that runs out of memory halves the size and is trained again (reported
    once, with the numbers); a single client that does not fit fails.
    """

    PROBE_CLIENTS = 2
    PROBE_CHUNKS = 2  # the first also pays one-time costs (kernels, workspaces, code pages)
    AUTO_LIMIT = 256  # a bad estimate or one failing client never takes a whole large shard
    UNMEASURED = 16  # engine.vectorize_chunk's default, where the platform shows no peak

    def __init__(
        self, configured: int | Literal["auto"], device: torch.device, budget: Callable[[], float]
    ) -> None:
        self.size = None if configured == "auto" else int(configured)
        self.device = device
        self.budget = budget  # bytes the worker may still fill, asked when measuring
        self.bytes_per_client = 0.0
        self._probed: list[float] = []  # bytes a client, per probe chunk

    @classmethod
    def for_worker(
        cls, job: JobConfig, model: nn.Module, device: torch.device, gpu_fraction: float | None
    ) -> ChunkSize:
        """A worker's sizes, kept for its life; first its GPU slice is checked to hold the model
        (``check_slice``), so a worker count the card cannot hold is refused before training."""
        check_slice(model, device, gpu_fraction)
        share = cpu_memory_share(job.resources)
        return cls(job.engine.vectorize_chunk, device, lambda: memory_budget(device, gpu_fraction, share))

    @property
    def measuring(self) -> bool:
        return self.size is None

    def next(self, pending: int) -> int:
        """The size of the next chunk when ``pending`` clients are left to train."""
        return min(pending, self.PROBE_CLIENTS if self.size is None else self.size)

    def measured(self, clients: int, peak_bytes: float) -> None:
        """Notes the peak a probe chunk of ``clients`` added; sizes ``auto`` after the last."""
        self._probed.append(peak_bytes / clients)
        if len(self._probed) < self.PROBE_CHUNKS:
            return
        self.bytes_per_client = min(self._probed)
        if self.bytes_per_client <= 0:  # no peak to read (not Linux, or /proc is closed to us)
            self.size = self.UNMEASURED
            return
        self.size = chunk_that_fits(self.bytes_per_client, self.budget(), self.AUTO_LIMIT)
        log.info(
            "%s: %.1f MiB a client measured, chunks of %d clients",
            self.device,
            self.bytes_per_client / MiB,
            self.size,
        )

    def back_off(self, chunk: list[int], error: BaseException) -> bool:
        """Halves the size after ``chunk`` ran out of memory and says so, once; False when it
        cannot (a single client)."""
        if len(chunk) == 1:
            return False
        self.size = len(chunk) // 2
        log.warning("%s; training on in chunks of %d", self._numbers(chunk, error), self.size)
        return True

    def failure(self, chunk: list[int], error: BaseException) -> MemoryError:
        """The error a chunk that no back-off can fit fails its clients with."""
        fix = "raise resources.gpus_per_worker (fewer workers per GPU) or lower the batch size"
        if self.device.type != "cuda":
            fix = "give each worker more memory (resources.cpus_per_worker) or lower the batch size"
        return MemoryError(f"{self._numbers(chunk, error)}; {fix}")

    def _numbers(self, chunk: list[int], error: BaseException) -> str:
        per_client = self.bytes_per_client / MiB
        measured = f", {per_client:.1f} MiB a client measured" if per_client else ""
        who = f"client {chunk[0]}, alone in its chunk," if len(chunk) == 1 else f"a chunk of {_listed(chunk)}"
        return (
            f"{who} ran out of memory on {self.device}: "
            f"{str(error).splitlines()[0]} (budget {self.budget() / MiB:,.0f} MiB{measured}; "
            f"engine.vectorize_chunk)"
        )


def _listed(ids: list[int]) -> str:
    return f"{len(ids)} clients ({', '.join(map(str, ids[:8]))}{', ...' if len(ids) > 8 else ''})"


def is_out_of_memory(error: BaseException) -> bool:
    """A device's out-of-memory, or the CPU allocator's refusal."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


class ChunkResults:
    """A round's clients trained in chunks of ``size``'s clients, in task order, each chunk on the
    first request for one of its clients; a chunk that raises fails each of its clients with the
    error, except an out-of-memory, after which the chunk is trained again in smaller chunks."""

    def __init__(
        self,
        train_chunk: Callable[[list[int]], list[ClientResult]],
        client_ids: Sequence[int],
        size: ChunkSize,
    ) -> None:
        self._train_chunk = train_chunk
        self._pending = list(client_ids)  # not yet trained, in task order
        self._size = size
        self._done: dict[int, tuple[ClientResult | Exception, float]] = {}

    def result(self, client_id: int) -> tuple[ClientResult, float]:
        """The client's result and its share of its chunk's seconds; raises its chunk's error."""
        if client_id not in self._done and client_id not in self._pending:
            raise KeyError(f"client {client_id} is not one of this round's")
        while client_id not in self._done:
            self._train_next()
        outcome, seconds = self._done[client_id]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, seconds

    def _train_next(self) -> None:
        chunk = self._pending[: self._size.next(len(self._pending))]
        start = time.perf_counter()
        outcomes: Sequence[ClientResult | Exception]
        peak = PeakMemory(self._size.device) if self._size.measuring else None  # probes only
        try:
            with peak or nullcontext():
                outcomes = self._train_chunk(chunk)
            if peak is not None:
                self._size.measured(len(chunk), peak.bytes)
        except Exception as exc:
            if is_out_of_memory(exc):
                if self._size.device.type == "cuda":
                    torch.cuda.empty_cache()  # the failed chunk's cached blocks, before the retry
                if self._size.back_off(chunk, exc):
                    return  # the same clients, in smaller chunks
                exc = self._size.failure(chunk, exc)
            outcomes = [exc] * len(chunk)
        del self._pending[: len(chunk)]
        share = (time.perf_counter() - start) / len(chunk)
        self._done |= {cid: (outcome, share) for cid, outcome in zip(chunk, outcomes, strict=True)}
