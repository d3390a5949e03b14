"""``ChunkResults``: clients trained in chunks of the configured size, in task order, each chunk
once; a chunk's error fails each of its clients, and an out-of-memory names the fix. A CPU
worker keeps freed memory: a chunk's large tensors come from the heap, not fresh pages."""

import subprocess
import sys

import pytest
import torch

from raysim.runtime.chunks import ChunkResults
from raysim.types import ClientResult


def test_chunks_are_trained_once_each_in_task_order():
    trained = []

    def train_chunk(ids):
        trained.append(ids)
        return [ClientResult({}, float(cid), {}) for cid in ids]

    chunks = ChunkResults(train_chunk, [7, 3, 9, 1, 5], chunk_size=2)
    weights = [chunks.result(cid)[0].weight for cid in (7, 3, 9, 1, 5)]
    assert weights == [7.0, 3.0, 9.0, 1.0, 5.0]
    assert trained == [[7, 3], [9, 1], [5]]


def test_a_chunks_error_fails_each_of_its_clients_only():
    def train_chunk(ids):
        if 9 in ids:
            raise ValueError("bad client data")
        return [ClientResult({}, 1.0, {}) for _ in ids]

    chunks = ChunkResults(train_chunk, [7, 3, 9, 1], chunk_size=2)
    assert chunks.result(7)[0].weight == 1.0
    for cid in (9, 1):
        with pytest.raises(ValueError, match="bad client data"):
            chunks.result(cid)


def test_running_out_of_memory_names_the_chunk_size_to_lower():
    def train_chunk(ids):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    chunks = ChunkResults(train_chunk, [1, 2, 3], chunk_size=3)
    with pytest.raises(MemoryError, match=r"a chunk of 3 clients ran out .* lower engine.vectorize_chunk"):
        chunks.result(2)


MAPPED = """
import ctypes, numpy as np
from raysim.runtime.chunks import keep_freed_memory

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
