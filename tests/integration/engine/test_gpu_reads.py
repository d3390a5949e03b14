"""On a GPU (``pytest -m gpu``): a worker reads its clients' checks and metrics back once per
round (``raysim.runtime.device_reads``), and a round with a diverged client is trained again so
that the run drops the same clients as on the CPU. Skipped without CUDA."""

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.runtime import worker as raysim_worker

pytestmark = pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device")


def diverging(device_gpus: int, **extra):
    """Clients 0, 7 and 14 of 20 diverge (tests/plugins/algorithms/diverging.py)."""
    return tiny_job(
        algorithm={"name": "diverging_test", "inner": "fedavg", "failure": "diverge"},
        engine={"num_rounds": 4, "max_failed_clients": 6},
        resources={"gpus_per_worker": device_gpus, "deterministic": True},
        **extra,
    )


@pytest.mark.gpu
def test_a_gpu_round_drops_the_clients_the_cpu_drops_and_reads_metrics_as_floats(tmp_path, monkeypatch):
    cpu = run(diverging(0), output_dir=tmp_path / "cpu")
    passes = []
    real = raysim_worker.RoundChecks
    monkeypatch.setattr(raysim_worker, "RoundChecks", lambda defer: passes.append(defer) or real(defer))
    gpu = run(diverging(1), output_dir=tmp_path / "gpu")
    assert True in passes and False in passes  # queued on the card; a round trained again
    dropped = [m["sys/nonfinite_clients"] for _, m in gpu.history]
    assert dropped == [m["sys/nonfinite_clients"] for _, m in cpu.history] and sum(dropped) > 0
    for (_, g), (_, c) in zip(gpu.history, cpu.history, strict=True):
        assert type(g["train/loss"]) is float
        assert g["train/loss"] == pytest.approx(c["train/loss"], rel=1e-4)
