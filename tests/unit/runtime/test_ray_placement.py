"""How many workers a cluster's resources hold (the cluster's totals injected, no Ray started)."""

import pytest

from raysim.config import ResourcesConfig
from raysim.runtime import ray_placement
from raysim.runtime.ray_placement import resolve_num_workers, shares_in, worker_slots


@pytest.mark.parametrize(
    ("gpus", "share", "held"),
    [(1.0, 0.2, 5), (2.0, 0.2, 10), (1.0, 0.1, 10), (3.0, 1 / 3, 9), (1.0, 0.1428, 7), (1.0, 0.3, 3)],
)
def test_shares_of_a_gpu_are_counted_without_float_floor_division_losing_one(gpus, share, held):
    assert shares_in(gpus, share) == held  # 1.0 // 0.2 is 4.0


def cluster(monkeypatch, **total):
    monkeypatch.setattr(ray_placement.ray, "cluster_resources", lambda: total)


def test_workers_left_to_raysim_fill_the_gpus_at_the_measured_share_capped_by_the_cpus(monkeypatch):
    cluster(monkeypatch, CPU=64.0, GPU=2.0)
    assert resolve_num_workers(ResourcesConfig(gpus_per_worker=0.2)) == 10  # 5 a card
    assert resolve_num_workers(ResourcesConfig(gpus_per_worker=0.2, cpus_per_worker=8)) == 8
    cluster(monkeypatch, CPU=4.0, GPU=1.0)
    assert resolve_num_workers(ResourcesConfig(gpus_per_worker=0.125)) == 4


def test_a_gpu_share_on_a_cluster_without_a_gpu_is_one_error_naming_the_fix(monkeypatch):
    cluster(monkeypatch, CPU=64.0)  # a CPU machine's local Ray: placing would wait 120 s, then fail
    for workers in (None, 2):
        with pytest.raises(ray_placement.ResourceError, match=(
            r"^resources.gpus_per_worker=0.5 asks for a GPU, and the Ray cluster has none; set "
            r"resources.gpus_per_worker to 0 \(CPU workers\) or run where a GPU is$"
        )):  # fmt: skip
            resolve_num_workers(ResourcesConfig(gpus_per_worker=0.5, num_workers=workers))


def test_a_node_holds_as_many_workers_as_its_gpus_take_shares():
    assert worker_slots({"CPU": 16.0, "GPU": 1.0}, ResourcesConfig(gpus_per_worker=0.2)) == 5


@pytest.mark.parametrize(
    "cores, current, reserved, expected",
    [
        (2, 2, 2.0, 1),  # the 2-core VM, 2 workers of 1 CPU: one thread, never none
        (2, 2, 1.0, 1),
        (16, 16, 4.0, 12),  # a GPU node, 4 workers of 1 CPU: the 12 cores they leave
        (16, 8, 4.0, 8),  # never more than the driver had
        (16, 16, 0.0, 16),  # no worker on the driver's node
        (4, 4, 1.5, 2),  # half a core left is not a thread
    ],
)
def test_the_driver_keeps_the_cores_its_nodes_workers_leave(monkeypatch, cores, current, reserved, expected):
    monkeypatch.setattr(ray_placement.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert ray_placement.driver_threads(current, reserved) == expected
