"""What fits a worker's memory, from measured bytes (pure functions, no GPU needed), and the CPU
measurement of a block's peak."""

import platform
import subprocess
import sys

import pytest
import torch

from raysim.config import ResourcesConfig
from raysim.runtime.memory import (
    PeakMemory,
    chunk_that_fits,
    cpu_memory_share,
    gpu_share,
    slice_error,
    workers_per_gpu,
)
from raysim.runtime.phase_timer import PhaseTimer

MiB, GiB = 2**20, 2**30


def test_the_chunk_fills_at_most_four_fifths_of_the_budget():
    assert chunk_that_fits(10 * MiB, 1000 * MiB, limit=256) == 80
    assert chunk_that_fits(10 * MiB, 1000 * MiB - 1, limit=256) == 79  # 799.99... MiB holds 79
    assert chunk_that_fits(10 * MiB, 10 * GiB, limit=256) == 256


def test_a_single_client_is_tried_however_tight():
    assert chunk_that_fits(10 * MiB, 1 * MiB, limit=256) == 1


def test_workers_per_gpu_and_the_share_that_packs_them():
    assert workers_per_gpu(9 * GiB, 80 * GiB) == 7  # 64 GiB usable / 9
    assert gpu_share(9 * GiB, 80 * GiB) == pytest.approx(1 / 7)
    assert gpu_share(40 * GiB, 80 * GiB) == 1.0


def test_a_worker_that_does_not_fit_the_card_is_refused_with_both_numbers():
    assert workers_per_gpu(70 * GiB, 80 * GiB) == 0
    with pytest.raises(MemoryError, match=r"peaks at 71,680 MiB, more than 80% of the GPU's 81,920 MiB"):
        gpu_share(70 * GiB, 80 * GiB)


def test_a_ray_worker_gets_its_cpu_share_of_the_node_and_a_serial_one_all():
    assert cpu_memory_share(ResourcesConfig(backend="ray", cpus_per_worker=2), node_cpus=8) == 0.25
    assert cpu_memory_share(ResourcesConfig(backend="ray", cpus_per_worker=16), node_cpus=8) == 1.0
    assert cpu_memory_share(ResourcesConfig(backend="serial"), node_cpus=8) == 1.0


PEAK = """
import numpy as np, torch
from raysim.runtime.memory import PeakMemory, peak_rss_bytes
with PeakMemory(torch.device("cpu")) as peak:
    block = np.ones(25_000_000, np.float64)  # 200 MB, touched
    del block
with PeakMemory(torch.device("cpu")) as idle:
    pass
hwm = float(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
print(peak.bytes, idle.bytes, hwm, peak_rss_bytes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs")
def test_a_cpu_block_s_peak_is_its_resident_growth_even_after_it_freed_it():
    out = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, check=True)
    peak, idle, hwm, life = map(float, out.stdout.split())
    assert 190e6 < peak < 230e6
    assert idle < 10e6
    # the kernel's peak was reset by the second block; the process's peak over its life is kept
    assert hwm + 150e6 < life and life > 190e6


def test_a_slice_that_cannot_hold_the_models_update_is_refused_with_the_share_that_can():
    assert slice_error(1 * GiB, 80 * GiB, 0.25) is None  # 3 GiB in 20 GiB
    error = slice_error(10 * GiB, 80 * GiB, 0.25)  # 30 GiB in 20: two workers a card hold it
    assert error == (
        "resources.gpus_per_worker=0.25 gives each worker 20,480 MiB of the GPU's 81,920 MiB; the model "
        "with its gradients and optimizer state needs 30,720 MiB; raise it to 1/2 (0.5) or more"
    )
    assert "it does not fit the card" in str(slice_error(30 * GiB, 80 * GiB, 0.5))


class FakeAllocator:
    """The CUDA allocator's counters, as torch.cuda reads and resets them: allocated, and the peak."""

    def __init__(self) -> None:
        self.allocated = self.peak = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def install(self, monkeypatch) -> None:
        def reset(device=None):
            self.peak = self.allocated

        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_a_rounds_gpu_peak_survives_a_block_measured_inside_it(monkeypatch):
    """``ChunkSize``'s probes measure blocks with ``PeakMemory``, which resets the allocator's one
    peak; the round's ``PhaseTimer`` read that same peak, so a round that peaked before a probe
    under-reported it (the 900 below read as 300)."""
    cuda = FakeAllocator()
    cuda.install(monkeypatch)
    device = torch.device("cuda:0")
    cuda.alloc(100)  # the resident model
    timer = PhaseTimer(device)
    cuda.alloc(800)  # a client's update peaks at 900...
    cuda.free(800)
    with PeakMemory(device) as block:  # ...then a probe chunk adds 200
        cuda.alloc(200)
        cuda.free(200)
    assert block.bytes == 200
    assert timer.times().gpu_max_allocated_bytes == 900
    later = PhaseTimer(torch.device("cuda"))  # the next round: a span of its own, same card
    cuda.alloc(50)
    assert later.times().gpu_max_allocated_bytes == 150


ROUNDS = """
import resource, statistics, sys, torch
from raysim.aggregate import WeightedMean
from raysim.runtime.memory import keep_round_memory
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step
from raysim.types import ClientResult, ServerState

params = {"w": torch.ones(1_600_000), "b": torch.ones(128)}  # pfl's CNN's size
mean = WeightedMean()
partials = [mean.add(mean.zero(), i, ClientResult(params, 1.0)) for i in range(2)]
state = ServerState(params=params)

def round_faults():  # the driver's part of a round: merge, mean, server step
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    aggregate = mean.result(mean.merge(mean.merge(mean.zero(), partials[0]), partials[1]))
    apply_server_step(state, aggregate, ServerOptimizerConfig())
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if sys.argv[1] == "keep":
    keep_round_memory()
for _ in range(10):  # the heap grows to the rounds' layout
    round_faults()
print(statistics.median(round_faults() for _ in range(21)))  # the kernel reclaims a page now and then
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_round_s_temporaries_reuse_the_heap_instead_of_faulting_fresh_pages_in():
    """Without ``keep_round_memory`` about half of such processes fault some 8,000 pages in every
    round (where glibc's adaptive thresholds end up depends on the heap's layout)."""
    run = subprocess.run([sys.executable, "-c", ROUNDS, "keep"], capture_output=True, text=True, check=True)
    assert float(run.stdout) < 100  # pages: the merged sums alone are 3,125 of them


THREAD_HEAPS = """
import ctypes, resource, statistics, sys, threading
from raysim.runtime.memory import keep_round_memory

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MB = 1 << 20
keep_round_memory()

def client_faults():
    second = libc.malloc(30 * MB)  # with ``first``: the thread's arena's 64 MB heap nearly full
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    spill = libc.malloc(6 * MB)  # does not fit: it goes to a second heap
    ctypes.memset(spill, 1, 6 * MB)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    libc.free(second)
    libc.free(spill)  # the second heap empty, the first with room at its end
    return faults

def clients(out):
    first = libc.malloc(30 * MB)
    client_faults()  # the second heap's first use faults its pages in
    out.append(statistics.median(client_faults() for _ in range(9)))

out = []
thread = threading.Thread(target=clients, args=(out,))  # a direct line's thread: an arena of its own
thread.start()
thread.join()
print(out[0])
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_thread_s_spilled_temporaries_keep_their_heap_instead_of_faulting_it_in_again():
    """Without ``keep_round_memory``'s top pad glibc unmaps the emptied second heap after every
    use, and each use faults all 1,536 pages of the 6 MB in again."""
    run = subprocess.run([sys.executable, "-c", THREAD_HEAPS], capture_output=True, text=True, check=True)
    assert float(run.stdout) < 100
