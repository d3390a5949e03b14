"""On a GPU (``pytest -m gpu``; ``tools/gpu_check.py`` runs them): a block's peak is read from the
CUDA allocator, a real out-of-memory inside a worker's slice backs a chunk off, and a run with
auto chunks, bf16 and deterministic kernels trains the same bits twice. Skipped without CUDA."""

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.runtime.chunks import ChunkResults, ChunkSize
from raysim.runtime.memory import PeakMemory, memory_budget
from raysim.types import ClientResult

pytestmark = pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device")
MiB = 2**20
CUDA = torch.device("cuda")


@pytest.fixture
def slice_of_the_card():
    """This process held to 1/8 of the card, as a worker at resources.gpus_per_worker 0.125."""
    torch.cuda.set_per_process_memory_fraction(0.125)
    yield 0.125
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


@pytest.fixture
def restore_determinism():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.gpu
def test_a_blocks_peak_is_what_it_allocated_on_the_card():
    with PeakMemory(CUDA) as peak:
        block = torch.ones(64 * MiB, device=CUDA)  # 256 MiB of float32
        del block
    assert 256 * MiB <= peak.bytes < 264 * MiB


@pytest.mark.gpu
def test_a_real_out_of_memory_in_the_slice_halves_the_chunk(slice_of_the_card):
    budget = memory_budget(CUDA, slice_of_the_card, 1.0)
    per_client = int(budget / 6) // 4  # float32 elements: six clients fill the slice
    trained = []

    def train_chunk(ids):
        held = torch.empty((len(ids), per_client), device=CUDA)  # over the slice for 8 clients
        trained.append(ids)
        del held
        return [ClientResult({}, 1.0, {}) for _ in ids]

    size = ChunkSize(8, CUDA, lambda: memory_budget(CUDA, slice_of_the_card, 1.0))
    chunks = ChunkResults(train_chunk, list(range(12)), size)
    assert [chunks.result(c)[0].weight for c in range(12)] == [1.0] * 12
    assert [len(c) for c in trained] == [4, 4, 4] and size.size == 4


@pytest.mark.gpu
def test_auto_chunks_bf16_and_deterministic_kernels_train_the_same_bits_twice(tmp_path, restore_determinism):
    def final(name):
        job = tiny_job(
            resources={"gpus_per_worker": 1, "precision": "bf16", "deterministic": True},
            engine={"vectorize": "on", "vectorize_chunk": "auto", "num_rounds": 2},
        )
        return run(job, output_dir=tmp_path / name).state.params

    first, second = final("first"), final("second")
    assert all(torch.isfinite(first[k]).all() and torch.equal(first[k], second[k]) for k in first)
