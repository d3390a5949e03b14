"""How many Ray workers a job gets (counted from the cluster's resources, checked against the
placement) and what each gets: its device, threads and GPU share, and where ``gpus_per_worker:
auto`` is measured first, a whole GPU of the cluster to measure one worker's training on; and the
driver's threads beside the workers of its node.

Usage:
    num_workers = placeable_workers(resources, resolve_num_workers(resources))
    one = worker_setup_for(setup, resources)
    threads = driver_threads(torch.get_num_threads(), reserved_here=2.0)   # 2 workers x 1 CPU here
"""

from __future__ import annotations

import os
from dataclasses import replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysim.config import ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime.gpu_sizing import ProbeWork, WorkerPeak, no_gpu
from raysim.runtime.ray_session import init_ray, ray_result
from raysim.runtime.ray_workers import gpu_node_view, measure_here
from raysim.runtime.shipping import DataPlan, stores_to_ship
from raysim.runtime.wire import WorkerSetup


def cluster_shape() -> tuple[int, float]:
    """The Ray cluster's whole GPUs (at least one) and CPUs: what a GPU layout is laid out on."""
    total = ray.cluster_resources()
    return max(1, int(total.get("GPU", 0.0))), float(total.get("CPU", 0.0))


def resolve_num_workers(resources: ResourcesConfig) -> int:
    """The configured worker count, or as many as the cluster's CPUs (or GPU slots) allow."""
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    if resources.gpu_share > 0 and gpus == 0:
        raise ResourceError(
            f"resources.gpus_per_worker={resources.gpu_share:g} asks for a GPU, and the Ray cluster has "
            f"none; set resources.gpus_per_worker to 0 (CPU workers) or run where a GPU is"
        )
    if resources.num_workers is not None:
        wanted = resources.num_workers
        needs_cpus, needs_gpus = wanted * resources.cpus_per_worker, wanted * resources.gpu_share
        if needs_cpus > cpus + 1e-9 or needs_gpus > gpus + 1e-9:
            raise ResourceError(
                f"{wanted} workers x ({resources.cpus_per_worker} CPU, {resources.gpu_share} GPU) "
                f"requested, the Ray cluster has {cpus:g} CPU and {gpus:g} GPU; lower "
                f"resources.num_workers or the per-worker shares"
            )
        return wanted
    by_cpu = int(cpus // resources.cpus_per_worker)
    by_gpu = shares_in(gpus, resources.gpu_share) if resources.gpu_share > 0 else by_cpu
    if min(by_cpu, by_gpu) < 1:
        raise ResourceError(
            f"one worker needs {resources.cpus_per_worker} CPU and "
            f"{resources.gpu_share} GPU; the cluster has {cpus:g} CPU, {gpus:g} GPU"
        )
    return min(by_cpu, by_gpu)


def placeable_workers(resources: ResourcesConfig, wanted: int) -> int:
    """``wanted`` workers, checked against a strict placement the nodes cannot hold (Ray would
    wait for it forever); a worker count left to raysim shrinks to what the placement allows.

    Raises:
        ResourceError: ``STRICT_SPREAD`` with more workers than nodes that hold one, or
            ``STRICT_PACK`` with more than the largest node holds.
    """
    strategy = resources.placement
    if strategy not in ("STRICT_SPREAD", "STRICT_PACK"):
        return wanted
    slots = [worker_slots(node["Resources"], resources) for node in ray.nodes() if node["Alive"]]
    most = sum(1 for n in slots if n) if strategy == "STRICT_SPREAD" else max(slots, default=0)
    if resources.num_workers is None and most:
        return min(wanted, most)
    if wanted > most:
        one = f"({resources.cpus_per_worker} CPU, {resources.gpu_share} GPU)"
        if strategy == "STRICT_SPREAD":
            what = f"puts each of the {wanted} workers on its own node; {most} node(s) hold a worker {one}"
        else:
            what = f"puts all {wanted} workers on one node; the largest holds {most} workers {one}"
        loose = strategy.removeprefix("STRICT_")
        raise ResourceError(
            f"resources.placement={strategy} {what}; lower resources.num_workers or use placement {loose}"
        )
    return wanted


def worker_slots(node_resources: dict[str, float], resources: ResourcesConfig) -> int:
    """How many workers one node's total resources hold."""
    slots = int(node_resources.get("CPU", 0.0) // resources.cpus_per_worker)
    if resources.gpu_share > 0:
        slots = min(slots, shares_in(node_resources.get("GPU", 0.0), resources.gpu_share))
    return slots


def shares_in(gpus: float, share: float) -> int:
    """How many ``share``s of a GPU ``gpus`` hold: 5 of 0.2 in 1.0 (``1.0 // 0.2`` is 4.0 in floats)."""
    return int(gpus / share + 1e-9)


def probe_gpu_worker(setup: WorkerSetup, resources: ResourcesConfig, work: ProbeWork) -> WorkerPeak:
    """One worker's training measured on a whole GPU of the cluster (``gpus_per_worker: auto``):
    a task with one GPU finds a GPU node and what it sees of the data; the stores it cannot read
    are shipped (``resources.ship_data``); then a task on that node trains and measures
    (``gpu_sizing.measure_worker``), in a process that exits after it, freeing the card.

    Raises:
        ResourceError: no node of the cluster has a whole GPU, or the probe's own errors.
    """
    init_ray(resources)
    most = max((node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]), default=0.0)
    if most < 1:
        raise ResourceError(no_gpu(f"no node of the Ray cluster has a whole one (the largest has {most:g})"))
    plan = DataPlan.of(setup, resources.ship_data)
    node_id, view = ray_result(ray.remote(num_cpus=0, num_gpus=1)(gpu_node_view).remote(plan))
    plan = plan.ship(stores_to_ship(plan, [view]), ray.put)
    measure = ray.remote(num_cpus=resources.cpus_per_worker, num_gpus=1, max_calls=1)(measure_here)
    on_node = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray_result(measure.options(scheduling_strategy=on_node).remote(setup, plan, work.shipped()))


def driver_threads(current: int, reserved_here: float) -> int:
    """The driver's torch threads while workers share its node: the cores they leave free, at
    least one, never more than ``current``.

    Why: a pool thread the driver leaves spinning (OpenMP's wait before it sleeps) holds a core
    a worker needs as the round starts. On the 2-core VM with 2 workers, a driver started with
    one thread (``OMP_NUM_THREADS=1``) had a shorter time outside the workers in 4 of 4
    interleaved pairs, though its memory-bound mean and server step slowed (docs/performance.md,
    "Direct lines, and the driver's threads"; not measured on a many-core node).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(current, int(cores - reserved_here)))


def worker_setup_for(setup: WorkerSetup, resources: ResourcesConfig) -> WorkerSetup:
    """Device, threads and GPU memory share of one worker."""
    gpus = resources.gpu_share
    return replace(
        setup,
        device="cuda" if gpus > 0 else "cpu",
        num_threads=max(1, int(resources.cpus_per_worker)),
        gpu_memory_fraction=gpus if 0 < gpus < 1 else None,
    )
