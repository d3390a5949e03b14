"""``resources.gpus_per_worker: auto`` decided from a measured peak (the probe's result injected):
the share, the worker count it gives, the clients the probe trains, and the run's record of it."""

import numpy as np
import pytest

from raysim.config import JobConfig, ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime import gpu_sizing
from raysim.runtime.gpu_sizing import ProbeWork, WorkerPeak, probe_work, share_of, sized_resources
from raysim.runtime.wire import WorkerSetup
from raysim.types import Payload

MiB, GiB = 2**20, 2**30
SETUP = WorkerSetup(job={}, store_path="s", state_dir="d")
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

    def payload(self, state, round_num):
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


def never_asked():
    raise AssertionError("the probe's work is made only for auto on Ray")


def test_a_configured_share_is_kept_and_nothing_is_measured():
    resources = ResourcesConfig(backend="ray", gpus_per_worker=0.25)
    sized = sized_resources(resources, SETUP, never_asked)
    assert sized.resources is resources and sized.tags == {} and sized.note == ""


def test_auto_on_ray_takes_the_share_of_the_probes_peak_and_records_it(monkeypatch):
    work = ProbeWork(Payload(params={}), [4])
    probed = []

    def probe(setup, resources, asked):
        probed.append((setup, resources.cpus_per_worker, asked))
        return WorkerPeak(3.5 * GiB, 0.5 * GiB, 80 * GiB, "Test GPU 80GB", 1)

    monkeypatch.setattr("raysim.runtime.ray_backend.probe_gpu_worker", probe)
    sized = sized_resources(ResourcesConfig(gpus_per_worker="auto", cpus_per_worker=2), SETUP, lambda: work)
    assert probed == [(SETUP, 2, work)]
    assert sized.resources.gpus_per_worker == pytest.approx(1 / 16) and sized.resources.cpus_per_worker == 2
    assert sized.tags == {
        "gpus_per_worker": "0.0625", "gpu_worker_peak_mib": "4096", "gpu_worker_allocated_mib": "3584",
        "gpu_workers_per_card": "16",
    }  # fmt: skip
    assert sized.note == (
        "resources.gpus_per_worker: auto: one client peaks at 4,096 MiB (3,584 allocated, 512 CUDA "
        "context) on a Test GPU 80GB of 81,920 MiB: 16 workers per GPU, 0.0625 each"
    )


def test_the_run_records_auto_with_the_measured_tags_and_the_workers_start_with_the_share():
    raw = {**JOB, "resources": {"gpus_per_worker": "auto"}, "tracking": {"tags": {"a": "b"}}}
    job = JobConfig.from_dict(raw)
    sized = gpu_sizing.SizedResources(ResourcesConfig(gpus_per_worker=0.125), {"gpus_per_worker": "0.125"})
    assert sized.with_share(job).resources.gpus_per_worker == 0.125
    recorded = sized.with_tags(job)
    assert recorded.resources.gpus_per_worker == "auto"
    assert recorded.tracking.tags == {"a": "b", "gpus_per_worker": "0.125"}


def test_auto_under_the_serial_backend_is_the_whole_card(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    sized = sized_resources(ResourcesConfig(backend="serial", gpus_per_worker="auto"), SETUP, never_asked)
    assert sized.resources.gpus_per_worker == 1.0 and "whole card" in sized.note


def test_auto_without_a_gpu_is_refused_naming_the_key_and_the_fix(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ResourceError, match=(
        r"^resources.gpus_per_worker: auto measures a worker on a GPU, and this machine has none; set "
        r"resources.gpus_per_worker to 0 \(CPU workers\) or run where a GPU is$"
    )):  # fmt: skip
        sized_resources(ResourcesConfig(backend="serial", gpus_per_worker="auto"), SETUP, never_asked)
    with pytest.raises(ResourceError, match="this process has none"):
        gpu_sizing.measure_worker(SETUP, ProbeWork(Payload(params={}), [0]))
