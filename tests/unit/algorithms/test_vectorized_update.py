"""Each plugin's ``vectorized_update`` returns what its ``client_update`` returns client by client:
FedAvg (plain SGD and momentum), FedProx's proximal term, FedFish's Fisher (the extra pass, or
the last epoch's squared gradients), SCAFFOLD's control-variate correction and new variates.
Clients differ in data, size (unequal batch counts) and seed."""

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import context, payload

from raysim import registry
from raysim.algorithm import vectorizes
from raysim.stored import plain

SIZES = (5, 2, 9)


def contexts(extra=None, states=(None, None, None)):
    rng = np.random.default_rng(4)
    out = []
    for i, (n, state) in enumerate(zip(SIZES, states, strict=True)):
        x, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n)
        out.append(replace(context(x, y, payload(extra=extra), state=state, client_id=i), seed=100 + i))
    return out


def plugin(name, **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def assert_same_results(vectorized, sequential):
    for got, want in zip(vectorized, sequential, strict=True):
        torch.testing.assert_close(plain(got.update), plain(want.update), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(plain(got.state), plain(want.state), rtol=1e-5, atol=1e-6)
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


def test_a_plugin_without_the_hook_does_not_vectorize():
    assert not vectorizes(plugin("fedlc"))


@pytest.mark.parametrize(
    "options",
    [
        {},  # the authors' loop: a task step, then a step per anchor, alpha 0.5
        {"update_mode": "joint", "alpha_mode": "uniform"},  # Eq. 13, each client's own alphas
        {"alpha_mode": "uniform", "interpolated_mode": "eval", "local": {"momentum": 0.9}},
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


def test_fedgucci_plus_does_not_vectorize():
    assert not vectorizes(plugin("fedgucci_plus"))
