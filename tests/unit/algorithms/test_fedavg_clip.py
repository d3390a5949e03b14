"""FedAvgClip (algorithms/fedavg_clip.py) on one example and one local step, against the numpy
reference.

Client: delta = lr * g(w0), with norm n over (weight, bias); clip_norm = n / 2 halves it, a
clip_norm above n sends it unchanged.
Server (SGD lr 1, decay 0.5, round 2: lr 0.25): two equal-weight clients with deltas d and 3d
average to 2d, so w <- w0 - 0.25 * 2d = w0 - 0.5 d.
"""

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad, payload

from raysim import registry
from raysim.types import ClientResult, RunInfo

X, Y, LR = np.array([[1.0, -2.0]]), np.array([1]), 0.5

INFO = RunInfo(num_clients=2, cohort_size=2, num_rounds=3, spec=SPEC, seed=0)  # the run's facts


def make(**options):
    entry = registry.get("algorithm", "fedavg_clip")
    config = {"local": {"lr": LR, "batch_size": 1, "epochs": 1}, **options}
    return entry.factory(entry.config.model_validate(config))


def test_a_large_delta_is_clipped_to_the_norm_and_keeps_its_direction():
    gw, gb = grad(W0, B0, X, Y)
    norm = LR * np.sqrt((gw**2).sum() + (gb**2).sum())
    result = make(clip_norm=norm / 2).client_update(context(X, Y, payload()))
    assert np.allclose(result.update["weight"].numpy(), LR * gw / 2, atol=1e-6)
    assert np.allclose(result.update["bias"].numpy(), LR * gb / 2, atol=1e-6)
    assert result.metrics["clip/norm"] == pytest.approx(norm, rel=1e-5)
    assert result.metrics["clip/clipped"] == 1.0


def test_a_small_delta_is_sent_as_it_is():
    gw, gb = grad(W0, B0, X, Y)
    result = make(clip_norm=100.0).client_update(context(X, Y, payload()))
    assert np.allclose(result.update["weight"].numpy(), LR * gw, atol=1e-6)
    assert np.allclose(result.update["bias"].numpy(), LR * gb, atol=1e-6)
    assert result.metrics["clip/clipped"] == 0.0


def test_the_server_lr_decays_per_round():
    plugin = make(server_lr_decay=0.5)
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    state = plugin.init(params, RunInfo(num_clients=2, cohort_size=2, num_rounds=3, spec=SPEC, seed=0))
    agg, d = plugin.aggregator(), {"weight": torch.ones(2, 2), "bias": torch.ones(2)}
    acc = agg.zero()
    for position, scale in enumerate([1.0, 3.0]):
        acc = agg.add(acc, position, ClientResult({k: scale * v for k, v in d.items()}, weight=1.0))
    new, metrics = plugin.server_update(state, agg.result(acc), round_num=2, info=INFO)
    assert np.allclose(new.params["weight"].numpy(), W0 - 0.5, atol=1e-6)
    assert np.allclose(new.params["bias"].numpy(), B0 - 0.5, atol=1e-6)
    assert metrics["server/lr"] == 0.25
