"""``ChunkResults``: clients trained in chunks of the configured size, in task order, each chunk
once; a chunk's error fails each of its clients; an out-of-memory halves the chunk and trains it
again, and a single client that does not fit fails naming it and the fix. ``auto`` sizes chunks
from a first chunk's measured memory. A CPU worker keeps freed memory: a chunk's large tensors
come from the heap, not fresh pages. A job with ``privacy.sample`` never trains in chunks."""

import subprocess
import sys

import pytest
import torch

from raysim.config import JobConfig
from raysim.runtime import chunks as chunks_module
from raysim.runtime.builders import build_algorithm
from raysim.runtime.chunks import ChunkResults, ChunkSize, worker_vectorizes
from raysim.types import ClientResult

MiB = 2**20
CPU = torch.device("cpu")


def size(configured, budget=1000 * MiB):
    return ChunkSize(configured, CPU, lambda: budget)


def weights_of(ids):
    return [ClientResult({}, float(cid), {}) for cid in ids]


def test_chunks_are_trained_once_each_in_task_order():
    trained = []

    def train_chunk(ids):
        trained.append(ids)
        return [ClientResult({}, float(cid), {}) for cid in ids]

    chunks = ChunkResults(train_chunk, [7, 3, 9, 1, 5], size(2))
    weights = [chunks.result(cid)[0].weight for cid in (7, 3, 9, 1, 5)]
    assert weights == [7.0, 3.0, 9.0, 1.0, 5.0]
    assert trained == [[7, 3], [9, 1], [5]]


def test_a_chunks_error_fails_each_of_its_clients_only():
    def train_chunk(ids):
        if 9 in ids:
            raise ValueError("bad client data")
        return [ClientResult({}, 1.0, {}) for _ in ids]

    chunks = ChunkResults(train_chunk, [7, 3, 9, 1], size(2))
    assert chunks.result(7)[0].weight == 1.0
    for cid in (9, 1):
        with pytest.raises(ValueError, match="bad client data"):
            chunks.result(cid)


def test_running_out_of_memory_halves_the_chunk_retries_it_and_keeps_the_size(caplog):
    trained = []

    def train_chunk(ids):
        if len(ids) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        trained.append(ids)
        return weights_of(ids)

    kept = size(5)
    chunks = ChunkResults(train_chunk, [1, 2, 3, 4, 5, 6, 7], kept)
    assert [chunks.result(cid)[0].weight for cid in range(1, 8)] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert trained == [[1, 2], [3, 4], [5, 6], [7]]  # 5 // 2: chunks of 2 from then on
    assert kept.size == 2  # the next round starts there
    later = ChunkResults(train_chunk, [8, 9, 10], kept)
    assert later.result(10)[0].weight == 10.0 and trained[-2:] == [[8, 9], [10]]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # one back-off, one report
    assert "a chunk of 5 clients (1, 2, 3, 4, 5) ran out of memory on cpu" in warnings[0]
    assert "Tried to allocate 2.00 GiB" in warnings[0] and "budget 1,000 MiB" in warnings[0]
    assert "training on in chunks of 2" in warnings[0]


def test_a_single_client_that_does_not_fit_fails_naming_it_and_the_fix():
    def train_chunk(ids):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    chunks = ChunkResults(train_chunk, [4, 2], size(2))
    for cid in (4, 2):  # halved to one client each, each failing with its own id
        with pytest.raises(MemoryError, match=rf"client {cid}, alone in its chunk, ran out of") as caught:
            chunks.result(cid)
        assert "lower the batch size" in str(caught.value) and "budget 1,000 MiB" in str(caught.value)


def test_the_cpu_allocators_refusal_backs_off_too():
    def train_chunk(ids):
        if len(ids) > 1:
            raise RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory")
        return weights_of(ids)

    chunks = ChunkResults(train_chunk, [1, 2], size(2))
    assert chunks.result(2)[0].weight == 2.0


def test_auto_measures_two_chunks_of_two_then_fills_the_budget(monkeypatch):
    trained = []

    class Peak:  # 10 MiB a client of the chunk just trained, whatever the process holds
        def __init__(self, device):
            self.bytes = 0.0

        def __enter__(self):
            return self

        def __exit__(self, *exc):  # the first chunk also pays one-time costs: 5 MiB more
            self.bytes = 10 * MiB * len(trained[-1]) + (5 * MiB if len(trained) == 1 else 0)

    monkeypatch.setattr(chunks_module, "PeakMemory", Peak)

    def train_chunk(ids):
        trained.append(ids)
        return weights_of(ids)

    auto = size("auto", budget=100 * MiB)  # 80% of it at 10 MiB a client: 8 clients
    chunks = ChunkResults(train_chunk, list(range(20)), auto)
    assert chunks.result(19)[0].weight == 19.0
    assert [len(c) for c in trained] == [2, 2, 8, 8]
    assert auto.size == 8 and auto.bytes_per_client == 10 * MiB


def test_auto_never_takes_more_than_its_limit():
    auto = size("auto", budget=10**15)
    auto.measured(2, 2 * MiB)
    auto.measured(2, 2 * MiB)
    assert auto.size == ChunkSize.AUTO_LIMIT


MAPPED = """
import ctypes, numpy as np
from raysim.runtime.memory import keep_freed_memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2

def mapped_alone():  # the bytes a 200 MB array adds to allocations with a mapping of their own
    before = libc.mallinfo2().hblkhd
    array = np.ones(50_000_000, np.float32)
    return libc.mallinfo2().hblkhd - before

plain = mapped_alone()
keep_freed_memory()
print(plain, mapped_alone())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_large_allocation_comes_from_the_reused_heap_not_fresh_pages():
    out = subprocess.run([sys.executable, "-c", MAPPED], capture_output=True, text=True, check=True)
    plain, kept = map(int, out.stdout.split())
    assert plain >= 200_000_000  # glibc's default: a mapping of its own, unmapped when freed
    assert kept == 0


def test_auto_without_a_peak_to_read_takes_the_default_size():
    auto = size("auto")
    auto.measured(2, 0.0)
    auto.measured(2, 0.0)
    assert auto.size == ChunkSize.UNMEASURED == 16


def test_a_job_with_sample_level_privacy_trains_its_clients_one_at_a_time():
    """DP-SGD's per-example gradients live in the sequential trainer: ``auto`` says no (``on`` is
    refused before training, ``raysim.privacy.sample_level``)."""
    raw = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    private = {"privacy": {"sample": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}}
    job = JobConfig.from_dict(raw | {"engine": {"vectorize": "auto"}} | private)
    model = torch.nn.Linear(4, 2)
    assert not worker_vectorizes(job, build_algorithm(job), model, CPU, store=None)  # type: ignore[arg-type]
