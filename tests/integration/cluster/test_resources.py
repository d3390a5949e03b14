"""Worker resources: what the cluster cannot give is a clear ResourceError; GPU shares are enforced."""

import pytest
import torch

from jobs import tiny_job
from raysim.config import ResourcesConfig
from raysim.engine.loop import run
from raysim.errors import ResourceError
from raysim.runtime.ray_placement import placeable_workers, resolve_num_workers, worker_setup_for
from raysim.runtime.wire import WorkerSetup


def test_more_workers_than_cpus_is_refused(tmp_path, ray_local):
    with pytest.raises(
        ResourceError,
        match=r"5 workers x \(1.0 CPU, 0.0 GPU\) requested, the Ray "
        r"cluster has 2 CPU and 0 GPU",
    ):
        run(tiny_job(resources={"backend": "ray", "num_workers": 5}), output_dir=tmp_path)


def test_gpu_shares_without_gpus_are_refused(ray_local):
    with pytest.raises(
        ResourceError, match="gpus_per_worker=0.25 asks for a GPU, and the Ray cluster has none"
    ):
        resolve_num_workers(ResourcesConfig(gpus_per_worker=0.25))


def test_default_worker_count_is_one_per_cpu(ray_local):
    assert resolve_num_workers(ResourcesConfig()) == 2
    assert resolve_num_workers(ResourcesConfig(cpus_per_worker=2)) == 1


def test_a_strict_placement_the_nodes_cannot_hold_is_refused_not_awaited(ray_local):
    """One node of 2 CPUs: Ray would wait forever for a second node (or a bigger one)."""
    with pytest.raises(
        ResourceError,
        match=r"placement=STRICT_SPREAD puts each of the 2 workers on its own node; 1 node\(s\) hold a "
        r"worker .* use placement SPREAD",
    ):
        placeable_workers(ResourcesConfig(num_workers=2, placement="strict_spread"), 2)
    with pytest.raises(ResourceError, match=r"puts all 3 workers on one node; the largest holds 2 workers"):
        placeable_workers(ResourcesConfig(num_workers=3, cpus_per_worker=0.9, placement="STRICT_PACK"), 3)
    assert placeable_workers(ResourcesConfig(placement="STRICT_SPREAD"), 2) == 1  # a count left to raysim
    assert placeable_workers(ResourcesConfig(num_workers=2, placement="STRICT_PACK"), 2) == 2
    assert placeable_workers(ResourcesConfig(num_workers=2, placement="SPREAD"), 2) == 2


def test_a_gpu_worker_gets_cuda_threads_and_its_memory_share():
    base = WorkerSetup(job={}, store_path="s", state_dir="d")
    quarter = worker_setup_for(base, ResourcesConfig(cpus_per_worker=2, gpus_per_worker=0.25))
    assert (quarter.device, quarter.num_threads, quarter.gpu_memory_fraction) == ("cuda", 2, 0.25)
    whole = worker_setup_for(base, ResourcesConfig(gpus_per_worker=1))
    assert whole.gpu_memory_fraction is None
    cpu = worker_setup_for(base, ResourcesConfig())
    assert (cpu.device, cpu.gpu_memory_fraction) == ("cpu", None)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device")
def test_two_workers_share_one_gpu(tmp_path, ray_local):
    job = tiny_job(
        resources={"backend": "ray", "num_workers": 2, "gpus_per_worker": 0.5},
        algorithm={"name": "fedavg", "local": {"epochs": 3}},
        engine={"num_rounds": 5},
    )
    result = run(job, output_dir=tmp_path)
    assert result.final["eval/clients/accuracy"] > 0.5
    serial = run(
        tiny_job(algorithm={"name": "fedavg", "local": {"epochs": 3}}, engine={"num_rounds": 5}),
        output_dir=tmp_path / "cpu",
    )
    for k, v in serial.state.params.items():  # GPU kernels round differently: close, not equal
        assert torch.allclose(v, result.state.params[k], atol=1e-3), k


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a cluster without a GPU")
def test_a_measured_gpu_share_on_a_cluster_without_gpus_is_refused_before_training(tmp_path, ray_local):
    job = tiny_job(resources={"backend": "ray", "gpus_per_worker": "auto"})
    with pytest.raises(ResourceError, match=(
        r"^resources.gpus_per_worker: auto measures a worker on a GPU, and no node of the Ray cluster has "
        r"a whole one \(the largest has 0\); set resources.gpus_per_worker to 0"
    )):  # fmt: skip
        run(job, output_dir=tmp_path)
    assert not list(tmp_path.rglob("*.pt"))  # nothing trained


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device")
def test_a_measured_gpu_share_packs_the_workers_the_probes_peak_allows(tmp_path, ray_local):
    """gpus_per_worker: auto on Ray: the probe (a task with one GPU) measures one worker's chunk,
    the run trains with the share gpu_share gives for that peak, and records both; probed again, the same
    update's allocator peak is the one the run recorded (the CUDA context depends on the card's
    other processes, so only the allocator's part is compared)."""
    from raysim.engine.build import open_parts
    from raysim.runtime.gpu_sizing import RAY_UNITS, probe_work
    from raysim.runtime.memory import SAFETY
    from raysim.runtime.ray_placement import probe_gpu_worker
    from raysim.tracking.tracker import MemoryTracker

    job = tiny_job(resources={"backend": "ray", "gpus_per_worker": "auto", "num_workers": None},
                   engine={"num_rounds": 1, "vectorize": "on", "vectorize_chunk": 4})  # fmt: skip
    tracker = MemoryTracker()
    result = run(job, output_dir=tmp_path, tracker=tracker)
    assert [step for step, _ in result.history] == [0]
    assert tracker.params["resources.gpus_per_worker"] == "auto"  # the config as written
    tags = {
        key: float(tracker.tags[key])
        for key in (
            "gpus_per_worker",
            "gpu_worker_peak_mib",
            "gpu_worker_allocated_mib",
            "gpu_workers_per_card",
        )
    }

    parts = open_parts(job)
    setup = WorkerSetup(job.to_dict(), str(parts.store.path), str(tmp_path / "probe_state"))
    work = probe_work(job, parts.algorithm, parts.params, parts.info, parts.store.num_examples("train"),
                      parts.train_pool)  # fmt: skip
    peak = probe_gpu_worker(setup, job.resources, work)
    assert peak.clients == 4  # one chunk of the four largest clients
    model_bytes = sum(v.numel() * v.element_size() for v in parts.params.values())
    assert 3 * model_bytes <= peak.allocated_bytes < 2**30  # weights, gradients, the update: a tiny MLP
    assert 2**20 < peak.outside_bytes < 8 * 2**30  # a CUDA context: not nothing, not a card
    assert abs(peak.allocated_bytes / 2**20 - tags["gpu_worker_allocated_mib"]) <= 8

    run_peak = tags["gpu_worker_peak_mib"] * 2**20  # what the run's probe measured, to the MiB
    workers = int(SAFETY * peak.device_bytes // run_peak)
    assert tags["gpu_workers_per_card"] == workers and workers * tags["gpus_per_worker"] <= 1
    assert tags["gpus_per_worker"] == (RAY_UNITS // workers) / RAY_UNITS
