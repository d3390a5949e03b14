"""Ray workers on the driver's node take their rounds through shared memory
(``raysim.runtime.shared_segments``) and their calls over direct lines
(``raysim.runtime.direct_line``): the same model, bit for bit, as the serial backend's, with the
partials read from the workers' answer segments, a worker Ray restarts mid-run included."""

import os
import time

import ray
import torch

from jobs import tiny_job
from raysim.engine.build import build
from raysim.tracking.tracker import MemoryTracker


def rounds(job, output_dir, num_rounds, between=None):
    """The params after ``num_rounds``; the workers whose rounds went through shared memory, the
    sizes of their answer segments and the workers with a direct line at the end."""
    services, state = build(job, MemoryTracker(), None, output_dir)
    try:
        for round_num in range(num_rounds):
            state, _ = services.run_round(state, round_num)
            if between is not None and round_num == 0:
                between(services.backend)
        segments = getattr(services.backend, "segments", None)
        sizes = {w: s.buffer.nbytes for w, s in segments.answers.items()} if segments else {}
        open_lines = services.backend.lines.open_lines if hasattr(services.backend, "lines") else {}
        lines = {bundle: line.address.name for bundle, line in open_lines.items()}
        return state.params, getattr(services.backend, "local", set()), sizes, lines
    finally:
        services.backend.shutdown()


def test_rounds_through_shared_memory_equal_the_serial_backends(tmp_path, ray_local):
    """A 256-unit MLP (a 128 KiB float64 partial per tensor, out of band); round 0 answers whole
    and sizes the segments, the later rounds answer through them."""
    sections = {"model": {"name": "mlp", "hidden": [256]}, "evaluation": {"every": 0}}
    ray_job = tiny_job(resources={"backend": "ray", "num_workers": 2}, **sections)
    serial_job = tiny_job(resources={"backend": "serial", "num_workers": 2}, **sections)
    on_ray, local, sizes, lines = rounds(ray_job, tmp_path / "ray", 3)
    serial, _, _, _ = rounds(serial_job, tmp_path / "serial", 3)
    assert local == {0, 1} and set(lines) == {0, 1}  # both workers share the driver's memory and node
    largest = max(v.numel() * 8 for v in serial.values())  # a float64 sum out of band (>= 64 KiB)
    assert largest >= 1 << 16
    assert set(sizes) == {0, 1} and all(size >= largest for size in sizes.values())
    assert serial.keys() == on_ray.keys()
    assert all(torch.equal(serial[k], on_ray[k]) for k in serial)


def test_the_driver_leaves_its_nodes_workers_their_cores_and_takes_its_threads_back(tmp_path, ray_local):
    """Two workers of 1 CPU on the driver's node: the driver trains nothing and keeps the cores
    they leave (at least one) for its arithmetic, and has its threads back after shutdown."""
    before = torch.get_num_threads()
    job = tiny_job(resources={"backend": "ray", "num_workers": 2}, evaluation={"every": 0})
    services, state = build(job, MemoryTracker(), None, tmp_path)
    try:
        services.run_round(state, 0)
        during = torch.get_num_threads()
    finally:
        services.backend.shutdown()
    assert during == max(1, min(before, len(os.sched_getaffinity(0)) - 2))
    assert torch.get_num_threads() == before


def test_a_worker_restarted_mid_run_answers_through_ray_then_on_a_new_line(tmp_path, ray_local):
    """Worker 0 killed after round 0 and restarted by Ray before round 1: its line is broken, so
    round 1's call goes through Ray to the new process, which then gets a line of its own; the
    model is the serial backend's, bit for bit."""
    sections = {"model": {"name": "mlp", "hidden": [32]}, "evaluation": {"every": 0}}
    ray_job = tiny_job(resources={"backend": "ray", "num_workers": 2}, **sections)
    serial_job = tiny_job(resources={"backend": "serial", "num_workers": 2}, **sections)

    first_line = []

    def restart_first(backend):
        worker = backend.workers[0]
        first_line.append(backend.lines.open_lines[0].address.name)
        ray.kill(worker, no_restart=False)
        deadline = time.monotonic() + 60
        while ray.get(worker.open_line.remote()).name == first_line[0]:  # the old process, not yet gone
            assert time.monotonic() < deadline, "Ray did not restart the worker within 60 s"
            time.sleep(0.1)

    on_ray, _, _, lines = rounds(ray_job, tmp_path / "ray", 3, between=restart_first)
    serial, _, _, _ = rounds(serial_job, tmp_path / "serial", 3)
    assert set(lines) == {0, 1} and lines[0] != first_line[0]  # the restarted process's line
    assert all(torch.equal(serial[k], on_ray[k]) for k in serial)
