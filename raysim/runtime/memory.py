"""A worker's training memory, measured, and what fits in it: how many clients train at once
(``engine.vectorize_chunk: auto``) and how many workers share one GPU.

The sizing functions are pure (measured bytes in, counts out), so they are tested without a GPU;
``PeakMemory`` and ``memory_budget`` read the device.

Usage:
    with PeakMemory(device) as peak:
        train(chunk)
    size = chunk_that_fits(peak.bytes / len(chunk), memory_budget(device, fraction, share), limit)
    gpus_per_worker = gpu_share(peak_bytes_of_one_worker, device_bytes)
    check_slice(model, device, fraction)   # a worker, as it starts: the slice holds the model
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from types import TracebackType

import torch
from torch import nn

from raysim.config import ResourcesConfig
from raysim.errors import ResourceError

# Of a budget, the part a measured peak may fill: the rest covers the allocator's fragmentation
# and what one small chunk's peak does not show (a larger chunk's longer-lived temporaries).
SAFETY = 0.8
MiB = 2**20


def chunk_that_fits(bytes_per_client: float, budget_bytes: float, limit: int) -> int:
    """The most clients at once whose measured memory (positive) fills at most ``SAFETY`` of the
    budget, between 1 (a single client is tried however tight the budget) and ``limit``."""
    return max(1, min(limit, int(SAFETY * budget_bytes // bytes_per_client)))


def workers_per_gpu(peak_bytes: float, device_bytes: float) -> int:
    """How many workers one GPU holds when each peaks at ``peak_bytes`` (0: not even one)."""
    return int(SAFETY * device_bytes // peak_bytes) if peak_bytes > 0 else 1


def gpu_share(peak_bytes: float, device_bytes: float) -> float:
    """The ``resources.gpus_per_worker`` that packs as many such workers on a GPU as fit.

    Raises:
        MemoryError: one worker's peak does not fit the card, with both numbers.
    """
    per_gpu = workers_per_gpu(peak_bytes, device_bytes)
    if per_gpu < 1:
        raise MemoryError(
            f"one worker peaks at {peak_bytes / MiB:,.0f} MiB, more than {SAFETY:.0%} of the GPU's "
            f"{device_bytes / MiB:,.0f} MiB; lower engine.vectorize_chunk or the batch size"
        )
    return 1.0 / per_gpu


def slice_error(model_bytes: float, device_bytes: float, fraction: float) -> str | None:
    """Why a GPU slice cannot hold the model with its gradients and one optimizer state (three
    copies of its weights: the least any update needs), or None when it can."""
    needs, held = 3 * model_bytes, fraction * device_bytes
    if needs <= held:
        return None
    per_gpu = int(device_bytes // needs)
    fix = f"raise it to 1/{per_gpu} ({1 / per_gpu:.3g}) or more" if per_gpu else "it does not fit the card"
    return (
        f"resources.gpus_per_worker={fraction:g} gives each worker {held / MiB:,.0f} MiB of the GPU's "
        f"{device_bytes / MiB:,.0f} MiB; the model with its gradients and optimizer state needs "
        f"{needs / MiB:,.0f} MiB; {fix}"
    )


def check_slice(model: nn.Module, device: torch.device, fraction: float | None) -> None:
    """Refuses, as a worker starts, a GPU slice that cannot hold even the model's update.

    Raises:
        ResourceError: ``slice_error``'s numbers and fix.
    """
    if device.type != "cuda" or fraction is None:
        return
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    total = torch.cuda.get_device_properties(device).total_memory
    if (error := slice_error(model_bytes, total, fraction)) is not None:
        raise ResourceError(error)


def cpu_memory_share(resources: ResourcesConfig, node_cpus: int | None = None) -> float:
    """A worker's share of its node's memory: all of it under the serial backend (its workers
    take turns), else its share of the node's CPUs, which is how Ray packs workers on a node."""
    if resources.backend == "serial":
        return 1.0
    return min(1.0, resources.cpus_per_worker / (node_cpus or os.cpu_count() or 1))


def memory_budget(device: torch.device, gpu_fraction: float | None, cpu_share: float) -> float:
    """Bytes this worker may still fill: its GPU slice less what it holds already, or its share
    of the memory the node has available."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory * (gpu_fraction or 1.0)
        return max(0.0, total - torch.cuda.memory_allocated(device))
    return cpu_share * _meminfo_bytes("MemAvailable")


# The CUDA allocator keeps one peak per device. Measuring a block resets it, which would erase the
# peak of the round a ``PhaseTimer`` is reading: the erased peak is kept here and counted back in.
_erased_peaks: dict[int, int] = {}


def _card(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def reset_gpu_peak(device: torch.device) -> None:
    """Starts a new span for ``gpu_peak``: the round's peak, not the worker's life's."""
    _erased_peaks.pop(_card(device), None)
    torch.cuda.reset_peak_memory_stats(device)


def gpu_peak(device: torch.device) -> int:
    """The allocator's peak on ``device`` since ``reset_gpu_peak``, blocks measured meanwhile by
    ``PeakMemory`` included."""
    return max(_erased_peaks.get(_card(device), 0), torch.cuda.max_memory_allocated(device))


class PeakMemory:
    """The peak memory a block adds on ``device``, in ``bytes`` after it ends.

    On CUDA: the allocator's peak over what was allocated before. On a CPU (Linux): the growth of
    the process's peak resident set over its resident set before, after the heap's free pages
    were given back and the kernel's peak reset: an estimate (pages, not tensors); 0.0 where the
    kernel keeps no such count.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0.0
        self._start = 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            card = _card(self.device)
            _erased_peaks[card] = gpu_peak(self.device)  # a round's peak so far, kept over the reset
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = float(torch.cuda.memory_allocated(self.device))
        elif _reset_peak_rss():
            _return_free_heap()  # so that what the block reuses from the heap shows as growth too
            self._start = _status_bytes("VmRSS")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.device.type == "cuda":
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        elif self._start:
            self.bytes = max(0.0, _status_bytes("VmHWM") - self._start)


# Likewise the kernel keeps one peak resident set per process, which a CPU block's measurement
# resets: the process's peak before the latest reset is kept here for ``peak_rss_bytes``.
_erased_rss_peak = 0.0


def peak_rss_bytes() -> float:
    """This process's peak resident set over its life (Linux ``VmHWM``), the peaks ``PeakMemory``
    reset included; 0.0 where the kernel keeps no such count."""
    return max(_erased_rss_peak, _status_bytes("VmHWM"))


def _return_free_heap() -> None:
    """Gives the heap's free pages back to the kernel (glibc's ``malloc_trim``): a worker keeps
    freed memory (``keep_freed_memory``), which would hide a block's use."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing kept to give back
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def keep_round_memory() -> None:
    """Makes glibc's malloc keep the memory a round's model-sized temporaries free for the next
    round (on the driver: the merged float64 sums, their mean, the server step's tensors; on a
    CPU worker: each client's update and partial sums, for the next client).

    glibc serves allocations under 32 MB from its heap but gives the heap's top back to the kernel
    once twice the largest recent one is free there, so every round faulted the same pages in
    again: on the CIFAR benchmark's shape about 55 MB a round, most of the driver's time outside
    the workers. Allocations of 32 MB and more still map pages of their own; the heap keeps its
    peak (as a vectorizing worker's does, ``keep_freed_memory``).

    A thread's own arena (a Ray worker trains on its direct line's thread) grows in 64 MB heaps,
    and glibc unmaps a heap that empties whenever the heap before it has the top pad (128 KB by
    default) and a page free at its end, whatever the trim threshold: a client whose
    temporaries spilled into a new heap faulted 6.4 MB (pfl's CNN's dense layer) in again and
    again, 10,000 to 60,000 pages a round on the CIFAR shape. A top pad of a whole heap keeps
    every heap (glibc's ``heap_trim``). It costs address space, not resident memory: a new heap
    is writable whole, and the main heap grows by the pad beyond each request.
    """
    # 32 MB: glibc's own mmap ceiling; 64 MB: a thread arena's heap (``HEAP_MAX_SIZE``)
    _mallopt({_M_MMAP_THRESHOLD: 32 * MiB, _M_TRIM_THRESHOLD: _NEVER, _M_TOP_PAD: 64 * MiB})


def keep_freed_memory() -> None:
    """Makes glibc's malloc keep all freed memory for the next allocation instead of returning it
    (a vectorizing CPU worker).

    A chunk's tensors are large (16 clients' gradient of pfl's CNN's dense layer: 100 MB), above
    the 32 MB beyond which glibc maps fresh pages for each allocation and unmaps them when freed,
    so every step paid the kernel for faulting in and zeroing them again: measured on the CIFAR
    benchmark's shape, about a third of a vectorized step. The process keeps its peak heap.
    It holds for the main thread's arena only: a thread of its own still faults them in at
    every reuse, so such a worker trains on the main thread (``ray_workers.on_main_thread_only``).
    """
    _mallopt({_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: _NEVER})  # no mapping of its own: all from the heap


def _mallopt(settings: dict[int, int]) -> None:
    """glibc's ``mallopt`` for each (parameter, value); nothing where the C library is not glibc."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        libc = ctypes.CDLL("libc.so.6")
        for parameter, value in settings.items():
            libc.mallopt(parameter, value)


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4  # glibc's malloc.h
_NEVER = 2**31 - 1  # a trim threshold no heap top reaches: never given back


def _reset_peak_rss() -> bool:
    """Resets the kernel's peak resident set of this process (Linux ``clear_refs`` 5), the peak so
    far kept for ``peak_rss_bytes``."""
    global _erased_rss_peak
    _erased_rss_peak = peak_rss_bytes()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _status_bytes(field: str) -> float:
    return _kib_field(Path("/proc/self/status"), field)


def _meminfo_bytes(field: str) -> float:
    return _kib_field(Path("/proc/meminfo"), field)


def _kib_field(path: Path, field: str) -> float:
    """A ``Field:   123 kB`` line of a /proc file, in bytes (0.0 where there is none)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith(f"{field}:"):
            return float(line.split()[1]) * 1024
    return 0.0
