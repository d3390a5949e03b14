"""``resources.gpus_per_worker: auto`` resolved before the workers start: on Ray, one worker's
training measured on a whole GPU of the cluster (``ray_backend.probe_gpu_worker``, which trains
with ``gpu_sizing.measure_worker``) and the share that packs as many such workers as fit; under
the serial backend the whole card, its workers taking turns in one process.

Usage:
    sized = sized_resources(job.resources, setup, lambda: work)   # .resources.gpus_per_worker: 1/n
    job = sized.with_share(job)                                    # what the workers start with
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from raysim.config import JobConfig, ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime.gpu_sizing import ProbeWork, describe, no_gpu, share_of, sizing_tags
from raysim.runtime.wire import WorkerSetup


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
    from raysim.runtime.ray_backend import probe_gpu_worker

    peak = probe_gpu_worker(setup, resources, work())
    share = share_of(peak)
    sized = resources.model_copy(update={"gpus_per_worker": share})
    return SizedResources(sized, sizing_tags(peak, share), describe(peak, share))
