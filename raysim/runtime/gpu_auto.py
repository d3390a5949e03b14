"""``resources.gpus_per_worker: auto`` resolved before the workers start: on Ray, one worker's
training measured on a whole GPU of the cluster (``ray_placement.probe_gpu_worker``, which trains
with ``gpu_sizing.measure_worker``) and the share that packs as many such workers as fit; under
the serial backend the whole card, its workers taking turns in one process. With
``engine.vectorize: auto`` and ``resources.num_workers`` unset, the probe's peak only bounds the
workers a card may hold: the count is the fastest layout measured (``gpu_layout.py``,
``layout_timing.py``), cached per machine and job shape and written to the run's folder
(``gpu_layout.json``).

Usage:
    sized = sized_resources(job.resources, setup, lambda: work)   # .resources.gpus_per_worker: 1/n
    job = sized.with_share(job)                                    # what the workers start with
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from raysim.config import JobConfig, ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime.gpu_layout import (
    cache_path,
    candidates,
    choose,
    describe_choice,
    from_record,
    layout_record,
    layout_tags,
    read_cached,
    shape_key,
    write_record,
)
from raysim.runtime.gpu_sizing import ProbeWork, WorkerPeak, describe, no_gpu, share_of, sizing_tags
from raysim.runtime.memory import workers_per_gpu
from raysim.runtime.wire import WorkerSetup

LAYOUT_FILE = "gpu_layout.json"  # in the run's folder: the layouts measured and the one chosen


@dataclass(frozen=True)
class SizedResources:
    """The resources the workers start with, and what the run records of their sizing."""

    resources: ResourcesConfig
    tags: dict[str, str] = field(default_factory=dict)  # the run's tags (MLflow)
    note: str = ""  # the console line

    def with_share(self, job: JobConfig) -> JobConfig:
        """The job the workers start from: its resources with the measured share."""
        return job.model_copy(update={"resources": self.resources})

    def with_tags(self, job: JobConfig) -> JobConfig:
        """The job the run records: as configured (``auto``), its ``tracking.tags`` plus the sizing's."""
        tracking = job.tracking.model_copy(update={"tags": job.tracking.tags | self.tags})
        return job.model_copy(update={"tracking": tracking}) if self.tags else job


def sized_resources(
    resources: ResourcesConfig, setup: WorkerSetup, work: Callable[[], ProbeWork]
) -> SizedResources:
    """``resources`` with ``gpus_per_worker: auto`` measured (``probe_gpu_worker`` on Ray, on
    the ``work`` made only then), the run's tags and a console line saying so; any other value as
    it is.

    Raises:
        ResourceError: no GPU to measure on, or a worker that does not fit a card alone.
    """
    if resources.gpus_per_worker != "auto":
        return SizedResources(resources)
    if resources.backend == "serial":  # one process: its workers take turns on the whole card
        if not torch.cuda.is_available():
            raise ResourceError(no_gpu("this machine has none"))
        note = "resources.gpus_per_worker: auto: the serial backend's one process takes the whole card"
        whole = resources.model_copy(update={"gpus_per_worker": 1.0})
        return SizedResources(whole, {"gpus_per_worker": "1"}, note)
    from raysim.runtime.ray_placement import probe_gpu_worker

    made = work()
    peak = probe_gpu_worker(setup, resources, made)
    if chooses_layout(resources, setup.job):
        return fastest_layout(resources, setup, made, peak)
    share = share_of(peak)
    sized = resources.model_copy(update={"gpus_per_worker": share})
    return SizedResources(sized, sizing_tags(peak, share), describe(peak, share))


def chooses_layout(resources: ResourcesConfig, job: dict[str, Any]) -> bool:
    """Whether ``auto`` measures layouts: the job lets raysim choose both how its workers train
    (``engine.vectorize: auto``) and how many there are (``resources.num_workers`` unset)."""
    return job.get("engine", {}).get("vectorize") == "auto" and resources.num_workers is None


def fastest_layout(
    resources: ResourcesConfig, setup: WorkerSetup, work: ProbeWork, peak: WorkerPeak
) -> SizedResources:
    """The share of the fastest layout of those the card's memory and the node's CPUs allow,
    measured (or cached for this machine and job shape), recorded in the run's folder.

    Raises:
        ResourceError: a worker that does not fit a card alone (``share_of``).
    """
    from raysim.runtime import layout_timing, ray_placement

    cards, cpus = ray_placement.cluster_shape()
    key = shape_key(setup.job, peak.device_name, cards, cpus)
    record, cached = read_cached(key), True
    if record is None:
        fits = workers_per_gpu(peak.least, peak.device_bytes)
        if fits < 1:  # not even one client with the CUDA context fits the card
            share_of(replace(peak, allocated_bytes=peak.least - peak.outside_bytes))
        layouts = candidates(fits, int(cpus / cards / resources.cpus_per_worker))
        timings = layout_timing.time_layouts(setup, resources, work, layouts, cards)
        record, cached = layout_record(choose(timings), timings, key), False
        with suppress(OSError):  # a cache that cannot be written only costs the next run a measurement
            write_record(cache_path(key), record)
    best, timings = from_record(record)
    write_record(Path(setup.state_dir).parent / LAYOUT_FILE, record)
    sized = resources.model_copy(update={"gpus_per_worker": best.layout.share})
    tags = sizing_tags(peak, best.layout.share) | layout_tags(best, timings)
    return SizedResources(sized, tags, describe_choice(best, timings, cached))
