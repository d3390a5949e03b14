"""Each plugin's ``vectorized_update`` returns what its ``client_update`` returns client by client:
FedAvg (plain SGD and momentum), FedProx's proximal term, FedFish's Fisher (the extra pass, or
the last epoch's squared gradients), SCAFFOLD's control-variate correction and new variates,
FedDyn's linear term (each client's own g_i) under both readings.
Clients differ in data, size (unequal batch counts) and seed; the FedFish and FedGuCci cases run
on a BatchNorm model too, and one case trains in a later round (lr decay, an epochs schedule)."""

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import context, payload
from torch import nn

from raysim import params as P
from raysim import registry
from raysim.algorithm import vectorizes
from raysim.stored import plain
from raysim.types import Payload

SIZES = (5, 2, 9)
NORM_SIZES = (6, 4, 10)  # in batches of 4, none leaves BatchNorm a single row


def contexts(extra=None, states=(None, None, None), round_num=0):
    rng = np.random.default_rng(4)
    out = []
    for i, (n, state) in enumerate(zip(SIZES, states, strict=True)):
        x, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n)
        ctx = context(x, y, payload(extra=extra), state=state, client_id=i)
        out.append(replace(ctx, seed=100 + i, round_num=round_num))
    return out


def norm_model():
    """Linear (no bias: BatchNorm takes it out), BatchNorm with running statistics of its own, ReLU,
    Linear."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4, bias=False), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model


NORM_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # BatchNorm over 4 rows amplifies float rounding


def norm_contexts(extra=None):
    """``contexts`` on ``norm_model``, whose weights are the broadcast."""
    broadcast = P.clone(P.model_params(norm_model()))
    rng = np.random.default_rng(4)
    out = []
    for i, n in enumerate(NORM_SIZES):
        x, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n)
        ctx = context(x, y, payload(extra=extra), client_id=i)
        sent = Payload({k: v.numpy() for k, v in broadcast.items()}, ctx.payload.extra)
        out.append(replace(ctx, model=norm_model(), payload=sent, global_params=broadcast, seed=100 + i))
    return out


def plugin(name, **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def assert_same_results(vectorized, sequential, rtol=1e-5, atol=1e-6):
    for got, want in zip(vectorized, sequential, strict=True):
        torch.testing.assert_close(plain(got.update), plain(want.update), rtol=rtol, atol=atol)
        torch.testing.assert_close(plain(got.state), plain(want.state), rtol=rtol, atol=atol)
        assert got.weight == want.weight
        assert got.metrics == pytest.approx(want.metrics, rel=1e-5)


@pytest.mark.parametrize(
    "name, options",
    [
        ("fedavg", {"local": {"lr": 0.2, "batch_size": 2, "epochs": 2}}),
        ("fedavg", {"local": {"lr": 0.2, "batch_size": 2, "momentum": 0.9, "weight_decay": 0.01}}),
        ("fedprox", {"mu": 0.5, "local": {"lr": 0.2, "batch_size": 2, "epochs": 3}}),
        ("fedfish", {"local": {"lr": 0.2, "batch_size": 2, "epochs": 2}}),  # the Fisher pass
        ("fedfish", {"local": {"lr": 0.2, "batch_size": 2}, "fisher_reduce": "mean", "fisher_mode": "eval"}),
        ("fedfish", {"local": {"lr": 0.2, "batch_size": 2, "epochs": 3}, "fisher_source": "last_epoch"}),
    ],
)
def test_the_fedavg_family_and_fedfish_match_client_update(name, options):
    algo = plugin(name, **options)
    assert vectorizes(algo)
    assert_same_results(algo.vectorized_update(contexts()), [algo.client_update(c) for c in contexts()])


@pytest.mark.parametrize("fisher_mode", ["train", "eval"])
def test_fedfish_matches_client_update_on_a_batchnorm_model(fisher_mode):
    local = {"lr": 0.2, "batch_size": 4, "epochs": 2, "momentum": 0.9}
    algo = plugin("fedfish", local=local, fisher_mode=fisher_mode)
    sequential = [algo.client_update(c) for c in norm_contexts()]
    assert_same_results(algo.vectorized_update(norm_contexts()), sequential, **NORM_TOLERANCE)


def test_a_later_round_trains_at_its_decayed_lr_for_its_scheduled_epochs():
    schedule = {"from_round": 1, "every": 1}
    local = {"lr": 0.2, "batch_size": 2, "epochs": 3, "lr_decay": 0.5, "epochs_schedule": schedule}
    algo = plugin("fedavg", local=local)  # round 2: lr 0.05, two epochs
    vectorized = algo.vectorized_update(contexts(round_num=2))
    assert_same_results(vectorized, [algo.client_update(c) for c in contexts(round_num=2)])
    assert [r.metrics["train/steps"] for r in vectorized] == [6.0, 2.0, 10.0]


def test_scaffold_matches_client_update_with_each_clients_own_variate():
    algo = plugin("scaffold", local={"lr": 0.2, "batch_size": 2, "epochs": 2})
    module = sys.modules[type(algo).__module__]  # plugins load under a private module name
    c = {"weight": np.float32([[0.3, -0.1], [0.2, 0.05]]), "bias": np.float32([0.1, -0.2])}
    rng = np.random.default_rng(7)
    own = [{k: torch.from_numpy(np.float32(rng.normal(size=v.shape))) for k, v in c.items()} for _ in "ab"]
    # the first client's first round (a zero variate), then two clients with variates of their own
    states = [None] + [module.ClientVariate(c_i) for c_i in own]
    extra = module.ServerVariate(c)
    assert_same_results(
        algo.vectorized_update(contexts(extra, states)),
        [algo.client_update(ctx) for ctx in contexts(extra, states)],
    )


@pytest.mark.parametrize("reading", ["paper", "fedgucci_code"])
def test_feddyn_matches_client_update_with_each_clients_own_linear_term(reading):
    algo = plugin("feddyn", alpha=0.3, reading=reading, local={"lr": 0.2, "batch_size": 2, "epochs": 2})
    module = sys.modules[type(algo).__module__]
    rng = np.random.default_rng(8)
    shapes = {"weight": (2, 2), "bias": (2,)}
    g = [{k: torch.from_numpy(np.float32(rng.normal(size=v))) for k, v in shapes.items()} for _ in "ab"]
    states = [None] + [module.LinearCorrection(g_i) for g_i in g]  # a first round, then g_i of their own
    assert vectorizes(algo)
    assert_same_results(
        algo.vectorized_update(contexts(states=states)),
        [algo.client_update(ctx) for ctx in contexts(states=states)],
    )


def test_a_plugin_without_the_hook_does_not_vectorize():
    assert not vectorizes(plugin("fedlc"))


@pytest.mark.parametrize(
    "options",
    [
        {},  # the authors' loop: a task step, then a step per anchor, alpha 0.5
        {"update_mode": "joint", "alpha_mode": "uniform"},  # Eq. 13, each client's own alphas
        {"alpha_mode": "uniform", "interpolated_mode": "eval", "local": {"momentum": 0.9}},
        {"local": {"optimizer": "adam", "lr": 0.01}},  # Adam's step count across the passes of a batch
    ],
)
def test_fedgucci_matches_client_update_with_two_anchors(options):
    local = {"lr": 0.2, "batch_size": 2, "epochs": 2} | options.pop("local", {})
    algo = plugin("fedgucci", num_anchors=2, beta=0.5, local=local, **options)
    module = sys.modules[type(algo).__module__]
    older = {"weight": np.float32([[0.2, 0.1], [-0.3, 0.4]]), "bias": np.float32([0.0, 0.1])}
    extra = module.Anchors([older])  # the broadcast is the newest anchor
    assert vectorizes(algo)
    assert_same_results(
        algo.vectorized_update(contexts(extra)), [algo.client_update(ctx) for ctx in contexts(extra)]
    )


def test_fedgucci_interpolated_in_eval_mode_matches_client_update_on_a_batchnorm_model():
    local = {"lr": 0.2, "batch_size": 4, "epochs": 2, "momentum": 0.9}
    algo = plugin("fedgucci", num_anchors=2, local=local, interpolated_mode="eval", alpha_mode="uniform")
    module = sys.modules[type(algo).__module__]
    trainable = dict(norm_model().named_parameters())
    extra = module.Anchors([{k: (v * 0.5).detach().numpy() for k, v in trainable.items()}])
    sequential = [algo.client_update(c) for c in norm_contexts(extra)]
    assert_same_results(algo.vectorized_update(norm_contexts(extra)), sequential, **NORM_TOLERANCE)


def test_fedgucci_plus_does_not_vectorize():
    assert not vectorizes(plugin("fedgucci_plus"))
