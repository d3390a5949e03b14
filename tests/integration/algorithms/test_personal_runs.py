"""The personalized baselines run end to end: two rounds of the tiny digits job on a ResNet-10
with BatchNorm (serial backend), each client's own predictor evaluated (``eval/personal/*``) and
every logged metric finite."""

import math

import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.config import JobConfig
from raysim.engine.loop import run

CASES = {
    "fedbabu": {"name": "fedbabu"},
    "fedbn": {"name": "fedbn"},
    "fedfomo": {"name": "fedfomo", "num_peers": 2},
    "fedrep": {"name": "fedrep", "head_epochs": 1},
}


def with_resnet(job: JobConfig) -> JobConfig:
    raw = job.to_dict()
    raw["model"] = {"name": "resnet10", "width": 4, "norm": "batch"}
    return JobConfig.from_dict(raw)


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_rounds_evaluate_each_clients_own_predictor(case, tmp_path):
    job = with_resnet(tiny_job(
        algorithm={**CASES[case], "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        engine={"num_rounds": 2, "cohort_size": 4},
        evaluation={"every": 1, "clients": 6},
    ))  # fmt: skip
    result = run(job, output_dir=tmp_path)
    for _, metrics in result.history:
        assert metrics["eval/personal/num_clients"] == 6 and 0 <= metrics["eval/personal/accuracy"] <= 1
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert P.is_finite(result.state.params)


def test_fedfomo_on_ray_matches_the_serial_backend(tmp_path, ray_local):
    """Per-client payloads and the evaluation with client state over two Ray workers: the same
    clients' models (to float rounding), the same personal accuracy and bytes down as in-process."""
    sections = {
        "algorithm": {"name": "fedfomo", "num_peers": 2, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        "engine": {"num_rounds": 3, "cohort_size": 4},
        "evaluation": {"every": 3, "clients": 6},
    }
    serial = run(tiny_job(**sections), output_dir=tmp_path / "s")
    on_ray = run(
        tiny_job(resources={"backend": "ray", "num_workers": 2}, **sections), output_dir=tmp_path / "r"
    )
    assert on_ray.final["sys/bytes_down/per_client"] == serial.final["sys/bytes_down/per_client"] > 0
    assert on_ray.final["eval/personal/accuracy"] == pytest.approx(
        serial.final["eval/personal/accuracy"], abs=1e-6
    )
    assert set(on_ray.state.extra.models) == set(serial.state.extra.models)
    for client, model in serial.state.extra.models.items():
        for key, value in model.items():
            assert torch.allclose(on_ray.state.extra.models[client][key], value, atol=1e-5), (client, key)


def test_fedfomo_resumed_from_its_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """The server's models and affinities, and each client's own model, survive a checkpoint."""

    def fedfomo(num_rounds):
        algorithm = {"name": "fedfomo", "num_peers": 2, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}}
        return tiny_job(algorithm=algorithm, engine={"num_rounds": num_rounds, "cohort_size": 4})

    whole = run(fedfomo(3), output_dir=tmp_path / "whole")
    first = run(fedfomo(2), output_dir=tmp_path / "first")
    resumed = run(
        fedfomo(3), resume_from=str(first.run_dir / "checkpoints" / "final.pt"), output_dir=tmp_path / "r"
    )
    assert resumed.state.extra.affinity == whole.state.extra.affinity
    for client, model in whole.state.extra.models.items():
        assert all(torch.equal(v, resumed.state.extra.models[client][k]) for k, v in model.items()), client
    assert resumed.final["eval/personal/accuracy"] == whole.final["eval/personal/accuracy"]
