"""``resources.gpus_per_worker: auto`` decided from a measured peak (the probe's result injected):
the share, the worker count it gives, the clients the probe trains, and the run's record of it."""

import numpy as np
import pytest

from raysim.config import JobConfig
from raysim.errors import ResourceError
from raysim.runtime.gpu_sizing import WorkerPeak, probe_work, share_of
from raysim.types import Payload

GiB = 2**30
JOB = {
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def peak(allocated_gib, outside_gib=0.5, device_gib=80):
    return WorkerPeak(allocated_gib * GiB, outside_gib * GiB, device_gib * GiB, "Test GPU 80GB", 1)


def test_the_share_packs_as_many_workers_as_four_fifths_of_the_card_hold():
    # 8.5 + 0.5 GiB a worker, 64 GiB usable: 7 workers; 1/7 rounded down to Ray's 1/10,000ths
    assert share_of(peak(8.5)) == pytest.approx(0.1428)
    assert share_of(peak(31.5)) == 0.5  # 32 GiB: 2 workers
    assert share_of(peak(50)) == 1.0


def test_the_context_outside_the_allocator_counts():
    assert share_of(peak(7.5, outside_gib=0.0)) == pytest.approx(0.125)  # 8 workers
    assert share_of(peak(7.5, outside_gib=1.5)) == pytest.approx(0.1428)  # 9 GiB: 7


@pytest.mark.parametrize("workers", [3, 5, 7, 9, 10, 11, 13, 30, 70])
def test_n_workers_at_the_chosen_share_fit_one_card_in_rays_arithmetic(workers):
    device = 80 * GiB
    share = share_of(WorkerPeak(0.8 * device / (workers + 0.5), 0.0, device, "card", 1))
    assert share <= 1 / workers and workers * round(share * 10_000) <= 10_000  # Ray rounds to nearest
    assert share > 1 / workers - 1e-4


def test_a_worker_that_does_not_fit_the_card_alone_is_a_resource_error_with_the_numbers_and_the_fix():
    with pytest.raises(ResourceError, match=(
        r"^resources.gpus_per_worker: auto: one worker peaks at 71,680 MiB, more than 80% of the GPU's "
        r"81,920 MiB; lower engine.vectorize_chunk or the batch size$"
    )):  # fmt: skip
        share_of(peak(69.5))


class Planner:
    """Stands in for a plugin: its round-0 payload marks the initial state it was built from."""

    def init(self, params, info):
        return ("state of", params)

    def payload(self, state, round_num, info):
        return Payload(params={"w": np.array([round_num])}, extra=state)


def work_for(engine):
    job = JobConfig.from_dict({**JOB, "engine": engine})
    sizes = np.array([5, 30, 7, 30, 2, 9, 12, 30])
    pool = np.array([0, 1, 2, 4, 5, 6, 7])  # client 3 is held out
    return probe_work(job, Planner(), {"p": 1}, None, sizes, pool)


def test_the_probe_trains_the_largest_client_or_a_chunk_of_the_largest():
    alone = work_for({"cohort_size": 5})
    assert alone.client_ids == [1]  # 30 examples; 3 is held out
    assert alone.payload.extra == ("state of", {"p": 1}) and alone.payload.params["w"][0] == 0
    assert work_for({"vectorize": "on", "vectorize_chunk": 3}).client_ids == [1, 7, 6]
    assert work_for({"vectorize": "auto", "vectorize_chunk": 3}).client_ids == [1, 7, 6]
    assert len(work_for({"vectorize": "on", "vectorize_chunk": "auto"}).client_ids) == 4  # ChunkSize's probes
    assert work_for({"vectorize": "on", "vectorize_chunk": 16, "cohort_size": 2}).client_ids == [1, 7]
