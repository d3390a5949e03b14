"""Each candidate layout of ``gpu_layout.py`` timed on the cluster: a pool of Ray workers started as
the run would start it, one warm-up round and ``TIMED_ROUNDS`` timed rounds of a cohort drawn as
round 0's is (the initial model, client state in a scratch folder), then the pool shut down.

A real pool rather than a model of one: what several processes on one card gain over one
vectorized worker (overlapping host work, the driver's copies spread over workers) is what a
model would have to guess. It costs one pool start and two rounds a candidate, once per machine
and job shape (``gpu_layout.read_cached``).

Usage:
    cards, cpus = cluster_shape()   # raysim.runtime.ray_placement
    timings = time_layouts(setup, resources, work, candidates(fits, cpus // cards), cards)
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace

import numpy as np

from raysim.config import ResourcesConfig
from raysim.runtime.backend import Backend
from raysim.runtime.gpu_layout import TIMED_ROUNDS, Layout, LayoutTiming
from raysim.runtime.gpu_sizing import ProbeWork
from raysim.runtime.wire import WorkerSetup
from raysim.services import RoundOptions


def pool_resources(resources: ResourcesConfig, layout: Layout, cards: int) -> ResourcesConfig:
    """The resources of a pool laid out as ``layout`` on ``cards`` GPUs."""
    return resources.model_copy(
        update={"gpus_per_worker": layout.share, "num_workers": layout.workers_per_card * cards}
    )


def timed_round_s(backend: Backend, work: ProbeWork) -> float:
    """One warm-up round of ``work.cohort``, then the least seconds of ``TIMED_ROUNDS`` rounds."""
    cohort = np.asarray(work.cohort, dtype=np.int64)
    seconds = []
    for _ in range(1 + TIMED_ROUNDS):
        start = time.perf_counter()
        backend.train_cohort(work.algorithm, work.payload, cohort, 0, RoundOptions())
        seconds.append(time.perf_counter() - start)
    return min(seconds[1:])


def time_layouts(
    setup: WorkerSetup, resources: ResourcesConfig, work: ProbeWork, layouts: list[Layout], cards: int
) -> list[LayoutTiming]:
    """Each layout's timed round on a pool of its own (``pool_resources``), one after another."""
    from raysim.runtime.ray_backend import RayBackend

    timings = []
    with tempfile.TemporaryDirectory() as scratch:  # the trial rounds' client state
        trial = replace(setup, state_dir=scratch)
        for layout in layouts:
            backend = RayBackend(trial, pool_resources(resources, layout, cards), work.num_examples)
            try:
                timings.append(LayoutTiming(layout, timed_round_s(backend, work), len(work.cohort)))
            finally:
                backend.shutdown()
    return timings
