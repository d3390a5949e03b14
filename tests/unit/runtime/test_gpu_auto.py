"""``resources.gpus_per_worker: auto`` resolved from a measured peak (the probe's result injected):
a configured share kept, auto on Ray and under the serial backend, and the run's record of it."""

import pytest

from raysim.config import JobConfig, ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime import gpu_auto, gpu_sizing
from raysim.runtime.gpu_auto import sized_resources
from raysim.runtime.gpu_sizing import ProbeWork, WorkerPeak
from raysim.runtime.wire import WorkerSetup
from raysim.types import Payload

GiB = 2**30
SETUP = WorkerSetup(job={}, store_path="s", state_dir="d")
JOB = {"dataset": {"name": "digits"}, "algorithm": {"name": "fedavg"}}  # the digits' own model


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

    monkeypatch.setattr("raysim.runtime.ray_placement.probe_gpu_worker", probe)
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
    sized = gpu_auto.SizedResources(ResourcesConfig(gpus_per_worker=0.125), {"gpus_per_worker": "0.125"})
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
