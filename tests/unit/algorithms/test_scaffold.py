"""SCAFFOLD (option II) on one example and K = 2 local steps, against the numpy reference.

With corrected gradients g(y) + c - c_i:
    y1 = x - lr (g(x) + c - c_i);  y2 = y1 - lr (g(y1) + c - c_i)
    c_i+ = c_i - c + (x - y2) / (K lr);  delta = x - y2;  dc = c_i+ - c_i
Server with two clients and N = 4: x <- x - mean(delta); c <- c + (2/4) mean(dc).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad

from raysim import registry
from raysim.types import RunInfo

LR, K = 0.1, 2
CLIENTS = [(np.array([[1.0, 2.0]]), np.array([0])), (np.array([[-0.5, 1.0]]), np.array([1]))]
C_W, C_B = np.array([[0.01, -0.02], [0.03, 0.0]]), np.array([0.01, -0.01])

INFO = RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)  # the run's facts


def algo():
    entry = registry.get("algorithm", "scaffold")
    return entry.factory(entry.config.model_validate({"local": {"lr": LR, "batch_size": 1, "epochs": K}}))


def reference_client(x, y, ci_w, ci_b):
    w, b = W0.copy(), B0.copy()
    for _ in range(K):
        gw, gb = grad(w, b, x, y)
        w, b = w - LR * (gw + C_W - ci_w), b - LR * (gb + C_B - ci_b)
    new_ci_w = ci_w - C_W + (W0 - w) / (K * LR)  # the bias follows the same rule
    return W0 - w, new_ci_w - ci_w, new_ci_w


def init_state(plugin):
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    state = plugin.init(params, RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=SPEC, seed=0))
    state.extra.c.update({"weight": torch.tensor(C_W).float(), "bias": torch.tensor(C_B).float()})
    return state


def test_client_update_and_persistent_variate():
    plugin = algo()
    state = init_state(plugin)
    ci = plugin.ClientState({"weight": torch.full((2, 2), 0.02), "bias": torch.zeros(2)})
    x, y = CLIENTS[0]
    result = plugin.client_update(context(x, y, plugin.payload(state, 0, INFO), state=ci))
    delta, dc, new_ci = reference_client(x, y, np.full((2, 2), 0.02), np.zeros(2))
    assert np.allclose(result.update.delta["weight"].numpy(), delta, atol=1e-6)
    assert np.allclose(result.update.dc["weight"].numpy(), dc, atol=1e-5)
    assert np.allclose(result.state.c_i["weight"].numpy(), new_ci, atol=1e-5)


def test_server_moves_model_and_variate():
    plugin = algo()
    state = init_state(plugin)
    agg = plugin.aggregator()
    acc = agg.zero()
    for i, (x, y) in enumerate(CLIENTS):
        acc = agg.add(acc, i, plugin.client_update(context(x, y, plugin.payload(state, 0, INFO))))
    new, _ = plugin.server_update(state, agg.result(acc), 0, INFO)
    refs = [reference_client(x, y, np.zeros((2, 2)), np.zeros(2)) for x, y in CLIENTS]
    mean_delta = (refs[0][0] + refs[1][0]) / 2  # unweighted, as in the paper
    mean_dc = (refs[0][1] + refs[1][1]) / 2
    assert np.allclose(new.params["weight"].numpy(), W0 - mean_delta, atol=1e-6)
    assert np.allclose(new.extra.c["weight"].numpy(), C_W + 0.5 * mean_dc, atol=1e-5)


def test_local_optimizers_other_than_plain_sgd_are_refused():
    from pydantic import ValidationError

    config = registry.get("algorithm", "scaffold").config
    with pytest.raises(ValidationError, match="assume plain local SGD"):
        config.model_validate({"local": {"momentum": 0.9}})
    config.model_validate({"local": {"momentum": 0.0}})  # fine


def test_weight_counts_the_examples_trained_on():
    """Two examples, batch 1, max_steps 1: one example trained on, so weight and delta scale 1."""
    entry = registry.get("algorithm", "scaffold")
    config = {"local": {"lr": LR, "batch_size": 1, "max_steps": 1}, "weighted": True}
    plugin = entry.factory(entry.config.model_validate(config))
    state = init_state(plugin)
    x, y = np.array([[1.0, 2.0], [-0.5, 1.0]]), np.array([0, 1])
    result = plugin.client_update(context(x, y, plugin.payload(state, 0, INFO)))
    assert result.weight == 1.0 and float(result.update.weight) == 1.0


def test_the_update_is_a_frozen_dataclass_that_pickles_by_its_plugin_module():
    """Workers pickle partial sums of these to the driver, which finds the class in the plugin
    module the registry put in sys.modules (Ray itself: tests/integration/cluster/test_determinism.py)."""
    import dataclasses
    import pickle

    plugin = algo()
    state = init_state(plugin)
    x, y = CLIENTS[0]
    update = plugin.client_update(context(x, y, plugin.payload(state, 0, INFO))).update
    assert (
        dataclasses.is_dataclass(update) and type(update).__module__ == "raysim_plugins.algorithms.scaffold"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        update.dc = {}
    copy = pickle.loads(pickle.dumps(update))
    assert type(copy) is type(update) and torch.equal(copy.delta["weight"], update.delta["weight"])


def test_a_client_without_data_changes_nothing():
    """K = 0 steps: c_i+ = c_i - c + delta / (K lr) is undefined; the client keeps c_i, sends
    dc = 0 and weight 0, so neither the server variate nor the mean delta moves."""
    plugin = algo()
    state = init_state(plugin)
    c = {"weight": torch.full((2, 2), 0.5), "bias": torch.ones(2)}
    state = replace(state, extra=replace(state.extra, c=c))
    ci = plugin.ClientState({"weight": torch.full((2, 2), 0.1), "bias": torch.zeros(2)})
    empty = context(np.zeros((0, 2)), np.zeros(0), plugin.payload(state, 0, INFO), state=ci)
    result = plugin.client_update(empty)
    assert all(torch.equal(v, torch.zeros_like(v)) for v in result.update.dc.values())
    assert float(result.update.weight) == 0.0 and result.weight == 0.0
    assert torch.equal(result.state.c_i["weight"], ci.c_i["weight"])
