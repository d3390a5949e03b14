"""Vectorized rounds in the worker: whether a job's client updates train in chunks, and a round's
clients trained chunk by chunk (``engine.vectorize``, ``engine.vectorize_chunk``).

A round vectorizes when ``engine.vectorize`` is ``auto`` or ``on``, the plugin has a
``vectorized_update`` (``raysim.algorithm.vectorizes``), the model holds no randomness it cannot
draw per client (``raysim.train.vectorized.vectorization_blocker``) and the round measures no
client with a probe nor keeps the clients' local models (both need each client's model, which a
chunk never materialises); otherwise it runs the sequential loop. ``on`` refuses before training a
job whose plugin, model or probes cannot vectorize.

Usage:
    check_vectorize(job, algorithm, model, store)   # the driver, before any worker starts
    worker_vectorizes(job, algorithm, model, device, store)   # a worker, once
    chunks = ChunkResults(train_chunk, client_ids, job.engine.vectorize_chunk)
    result, seconds = chunks.result(client_id)  # trains its chunk the first time
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from raysim.algorithm import Algorithm, vectorizes
from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.errors import ConfigError
from raysim.train.vectorized import vectorization_blocker
from raysim.types import ClientResult


def vectorize_blocker(
    algorithm: Algorithm, model: nn.Module, algorithm_name: str, store: ClientStore | None = None
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
    job: JobConfig, algorithm: Algorithm, model: nn.Module, device: torch.device, store: ClientStore
) -> bool:
    """Whether a worker trains its rounds in chunks: ``engine.vectorize`` is not off and neither
    plugin nor model is in the way. On a CPU the worker then keeps freed memory for reuse."""
    name = job.algorithm.name
    vectorizes = job.engine.vectorize != "off" and vectorize_blocker(algorithm, model, name, store) is None
    if vectorizes and device.type == "cpu":
        keep_freed_memory()
    return vectorizes


def keep_freed_memory() -> None:
    """Makes glibc's malloc keep freed memory for the next allocation instead of returning it.

    A chunk's tensors are large (16 clients' gradient of pfl's CNN's dense layer: 100 MB), above
    the 32 MB beyond which glibc maps fresh pages for each allocation and unmaps them when freed,
    so every step paid the kernel for faulting in and zeroing them again: measured on the CIFAR
    benchmark's shape, about a third of a vectorized step. The process keeps its peak heap.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): nothing to tune
        return
    libc.mallopt(_M_MMAP_MAX, 0)  # no allocation of its own mapping: all from the heap
    libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # and the heap's top is never given back


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h


def check_vectorize(job: JobConfig, algorithm: Algorithm, model: nn.Module, store: ClientStore) -> None:
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


class ChunkResults:
    """A round's clients trained ``chunk_size`` at a time, in task order, each chunk on the first
    request for one of its clients; a chunk that raises fails each of its clients with the error."""

    def __init__(
        self,
        train_chunk: Callable[[list[int]], list[ClientResult]],
        client_ids: Sequence[int],
        chunk_size: int,
    ) -> None:
        self._train_chunk = train_chunk
        self._chunks = [list(client_ids[i : i + chunk_size]) for i in range(0, len(client_ids), chunk_size)]
        self._chunk_of = {cid: n for n, chunk in enumerate(self._chunks) for cid in chunk}
        self._done: dict[int, tuple[ClientResult | Exception, float]] = {}

    def result(self, client_id: int) -> tuple[ClientResult, float]:
        """The client's result and its share of its chunk's seconds; raises its chunk's error."""
        if client_id not in self._done:
            self._train(self._chunks[self._chunk_of[client_id]])
        outcome, seconds = self._done[client_id]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, seconds

    def _train(self, chunk: list[int]) -> None:
        start = time.perf_counter()
        outcomes: Sequence[ClientResult | Exception]
        try:
            outcomes = self._train_chunk(chunk)
        except torch.OutOfMemoryError as exc:
            error = MemoryError(
                f"a chunk of {len(chunk)} clients ran out of device memory ({str(exc).splitlines()[0]}); "
                f"lower engine.vectorize_chunk"
            )
            outcomes = [error] * len(chunk)
        except Exception as exc:
            outcomes = [exc] * len(chunk)
        share = (time.perf_counter() - start) / len(chunk)
        self._done |= {cid: (outcome, share) for cid, outcome in zip(chunk, outcomes, strict=True)}
