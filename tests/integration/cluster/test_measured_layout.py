"""The fastest layout measured on a real card (``gpus_per_worker: auto`` with ``vectorize:
auto``): each candidate's pool trains on the GPU, and the run trains with the fastest and says so."""

import json

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.runtime.gpu_auto import LAYOUT_FILE
from raysim.tracking.tracker import MemoryTracker


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device")
def test_auto_times_each_layout_on_the_card_and_trains_with_the_fastest(tmp_path, ray_local, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "cache"))
    job = tiny_job(resources={"backend": "ray", "gpus_per_worker": "auto", "num_workers": None},
                   engine={"num_rounds": 1, "vectorize": "auto"})  # fmt: skip
    tracker = MemoryTracker()
    result = run(job, output_dir=tmp_path / "runs", tracker=tracker)
    assert [step for step, _ in result.history] == [0]
    record = json.loads(next((tmp_path / "runs").rglob(LAYOUT_FILE)).read_text())
    measured = record["measured"]
    assert [t["layout"]["workers_per_card"] for t in measured] == [1, 2]  # the session's Ray: 2 CPUs
    assert all(t["round_s"] > 0 for t in measured)
    assert record["chosen"]["clients_per_s"] == max(t["clients_per_s"] for t in measured)
    chosen = record["chosen"]["layout"]["workers_per_card"]
    assert tracker.tags["gpu_workers_per_card"] == str(chosen)
    assert float(tracker.tags["gpus_per_worker"]) == pytest.approx(1 / chosen)
    assert list((tmp_path / "cache" / "layouts").glob("*.json"))  # the next run of this shape skips it
