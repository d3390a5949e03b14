"""The engine's cost accounting against hand counts: the values a payload carries, the training
cost of the cohorts since the last log, the inference cost of the predictor evaluated."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import raysim.models
from raysim.engine.cost import CostMeter, params_down
from raysim.engine.metrics import bytes_down
from raysim.types import DataSpec, Payload, RoundOutput, TrainedClient

SPEC = DataSpec("classification", (64,), 10)
MLP = {"name": "mlp", "hidden": [16]}
MLP_MACS, MLP_PARAMS = 64 * 16 + 16 * 10, (64 * 16 + 16) + (16 * 10 + 10)


@dataclass(frozen=True)
class Extra:
    anchors: np.ndarray
    stage: int


def meter() -> CostMeter:
    return CostMeter(MLP, np.zeros((5, 64), np.float32), SPEC)


def test_params_down_counts_the_shared_payload_per_client_and_each_own_part_once():
    payload = Payload({"w": np.zeros((2, 3), np.float32)}, Extra(np.zeros(4, np.float32), 1),
                      per_client={5: {"peer": np.zeros(7, np.float32)}})  # fmt: skip
    assert params_down(payload, 3) == (6 + 4) * 3 + 7
    assert bytes_down(payload, 3)["sys/bytes_down"] == 4 * params_down(payload, 3)  # float32


def test_the_cohorts_since_the_last_log_are_added_up_then_start_afresh():
    costs = meter()
    clients = [TrainedClient(0, 1.0, seconds=1.0), TrainedClient(1, 1.0, seconds=3.0)]
    payload = Payload({"w": np.zeros(10, np.float32)})
    costs.trained(RoundOutput(None, clients, params_up=20, client_peak_bytes=100.0), payload)
    costs.trained(RoundOutput(None, clients[:1], params_up=10, client_peak_bytes=50.0), payload)
    logged = costs.take({"train/loss": 1.0})
    assert logged == {
        "sys/client_seconds": pytest.approx((1.0 + 3.0 + 1.0) / 3),
        "sys/client_peak_bytes": 100.0,
        "sys/params_up": 30.0,
        "sys/params_down": 10 * 2 + 10 * 1,
        "sys/bytes_up": 0.0,  # the outputs say they weigh nothing
        "sys/bytes_down": 4.0 * (10 * 2 + 10 * 1),
        "sys/macs_per_example": MLP_MACS,
    }
    assert costs.take({"train/loss": 1.0}) == {}


def test_no_peak_is_logged_where_none_was_measured():
    costs = meter()
    costs.trained(RoundOutput(None, params_up=1), Payload({}))  # e.g. vectorized chunks
    assert "sys/client_peak_bytes" not in costs.take({})


def test_inference_cost_comes_with_an_evaluation_and_counts_an_ensembles_members():
    costs = meter()
    costs.evaluated()  # the global model
    assert costs.take({"train/loss": 1.0}) == {}  # no evaluation logged: the record is dropped
    costs.evaluated([None] * 4)
    assert costs.take({"eval/central/accuracy": 0.5}) == {
        "sys/inference_macs_per_example": 4 * MLP_MACS,
        "sys/inference_params": 4.0 * MLP_PARAMS,
    }
    wider = {"name": "mlp", "hidden": [32]}
    costs.evaluated([wider])
    assert costs.take({"eval/clients/accuracy": 0.5})["sys/inference_macs_per_example"] == 64 * 32 + 32 * 10
    costs.evaluated([None, wider])  # an ensemble of two architectures: the sum of its members
    assert costs.take({"eval/clients/accuracy": 0.5}) == {
        "sys/inference_macs_per_example": MLP_MACS + 64 * 32 + 32 * 10,
        "sys/inference_params": float(MLP_PARAMS + (64 * 32 + 32) + (32 * 10 + 10)),
    }


def test_each_architecture_is_built_and_counted_once(monkeypatch):
    built = []
    original = raysim.models.build_model
    monkeypatch.setattr(raysim.models, "build_model", lambda *a: built.append(a[0]) or original(*a))
    costs = meter()
    for _ in range(3):
        costs.model_cost()
        costs.model_cost(dict(MLP))  # the same section, another dict
    assert built == ["mlp"]


def test_counting_leaves_the_runs_random_stream_as_it_was():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    meter().model_cost()  # building a model seeds torch
    assert torch.equal(torch.rand(3), expected)
