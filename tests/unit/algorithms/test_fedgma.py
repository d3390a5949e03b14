"""FedGMA's client update and its server mask, by hand for three clients.

Client deltas of one 5-coordinate parameter "w" (and a float buffer "buf"), weights n = 1, 2, 1:
    d1 = [ 0.3,  0.2,  0.1, 0.4, -0.1]
    d2 = [ 0.6, -0.2, -0.1, 0.2, -0.2]
    d3 = [ 0.3,  0.5,  0.0, 0.0, -0.3]
    sum of signs S = [3, 1, 0, 2, -3];  A = |S| / 3 = [1, 1/3, 0, 2/3, 1]
    soft mask (tau 0.8): [1, 1/3, 0, 2/3, 1]
    weighted mean (d1 + 2 d2 + d3) / 4 = [0.45, 0.075, -0.025, 0.2, -0.2]
    masked mean = [0.45, 0.025, 0, 0.4/3, -0.2];  w <- w - masked mean (server SGD, lr 1)
The buffer takes the plain weighted mean.
"""

import importlib

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from reference import B0, SPEC, W0, context, grad

from raysim import registry
from raysim.types import ClientResult, RunInfo

D = np.array(
    [
        [0.3, 0.2, 0.1, 0.4, -0.1],
        [0.6, -0.2, -0.1, 0.2, -0.2],
        [0.3, 0.5, 0.0, 0.0, -0.3],
    ]
)
N = np.array([1.0, 2.0, 1.0])
BUFFERS = np.array([0.2, -0.4, 1.0])
W_START = np.array([1.0, 2.0, 3.0, 4.0, 5.0])

INFO = RunInfo(num_clients=3, cohort_size=3, num_rounds=1, spec=SPEC, seed=0)  # the run's facts


def plugin_module():
    return importlib.import_module(registry.get("algorithm", "fedgma").factory.__module__)


def algo(**options):
    entry = registry.get("algorithm", "fedgma")
    return entry.factory(entry.config.model_validate(options))


def hand_update(delta, n, buffer_delta):
    """A client's ``GMAUpdate`` built from the fields' definitions."""
    d = torch.tensor(delta, dtype=torch.float32)
    return plugin_module().GMAUpdate(
        delta={"w": d * n, "buf": torch.tensor(buffer_delta * n, dtype=torch.float32)},
        weight=torch.tensor(n),
        sign={"w": torch.sign(d)},
        count=torch.tensor(1.0),
        positive={"w": d.clamp_min(0)},
        negative={"w": d.clamp_max(0)},
    )


def payload_of(plugin):
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    state = plugin.init(params, RunInfo(num_clients=3, cohort_size=3, num_rounds=1, spec=SPEC, seed=0))
    return plugin.payload(state, 0, INFO)


def server_round(plugin, order=(0, 1, 2)):
    agg = plugin.aggregator()
    acc = agg.zero()
    for i in order:
        update = hand_update(D[i], N[i], BUFFERS[i])
        acc = agg.add(acc, i, ClientResult(update, float(N[i])))
    params = {"w": torch.tensor(W_START).float(), "buf": torch.zeros(())}
    info = RunInfo(
        num_clients=3, cohort_size=3, num_rounds=1, spec=SPEC, seed=0, buffer_keys=frozenset({"buf"})
    )
    state = plugin.init(params, info)
    return plugin.server_update(state, agg.result(acc), 0, INFO)


def test_soft_mask_by_hand_for_three_clients():
    new, metrics = server_round(algo())
    masked = np.array([0.45, 0.075 / 3, 0.0, 0.2 * 2 / 3, -0.2])
    assert np.allclose(new.params["w"].numpy(), W_START - masked, atol=1e-6)
    assert float(new.params["buf"]) == pytest.approx(-(N @ BUFFERS) / N.sum())  # unmasked mean
    assert metrics["fedgma/agreed_fraction"] == pytest.approx(2 / 5)  # coordinates 0 and 4


def test_a_low_threshold_passes_every_coordinate_with_some_agreement():
    # A = 1/3 >= 0.3 now passes whole; A = 0 still zeroes
    new, _ = server_round(algo(agreement_threshold=0.3))
    masked = np.array([0.45, 0.075, 0.0, 0.2, -0.2])
    assert np.allclose(new.params["w"].numpy(), W_START - masked, atol=1e-6)


def ima_code_reference(global_w, deltas, n, tau, lr):
    """Our reading of the IMA authors' rule (utils/aggregator.py, agg_mode 'gma'), every client's
    term taken against the old global and summed:
    w_fma = sum_i p_i local_i;  S = sum_i sign(local_i - global)
    mask_i = not xor(local_i - global > 0, S > 0) and |S| > tau m
    w = w_fma - lr * sum_i (local_i - global) * mask_i / m
    Not a literal run of their loop: its ``p1.data = p0.data`` aliases the global model to the
    w_fma model, so from the second client on the term and mask use local_i - (running w), an
    order-dependent result (see the plugin's docstring)."""
    local = global_w - deltas  # (m, P)
    w_fma = (n[:, None] * local).sum(0) / n.sum()
    s = np.sign(local - global_w).sum(0)
    m = len(deltas)
    new = w_fma.copy()
    for i in range(m):
        mask = ((local[i] - global_w > 0) == (s > 0)) & (np.abs(s) > tau * m)
        new -= lr * (local[i] - global_w) * mask / m
    return new


def test_ima_code_reading_matches_our_reading_of_the_authors_rule():
    lr = 0.5  # large enough to see; the authors' 1e-4 is the default
    new, _ = server_round(algo(reading="ima_code", ima_code_server_lr=lr))
    expected = ima_code_reference(W_START, D, N, 0.8, lr)
    assert np.allclose(new.params["w"].numpy(), expected, atol=1e-6)
    # only coordinates 0 (S = 3) and 4 (S = -3) pass |S| > 2.4; they move back towards w
    fma = W_START - (N @ D) / N.sum()
    assert np.allclose(expected - fma, [0.5 * 1.2 / 3, 0, 0, 0, 0.5 * -0.6 / 3])


def test_ima_code_reading_does_not_depend_on_the_clients_order():
    """Every term is taken against the old global, so any order gives the same model (the
    authors' aliased loop does not: its later clients see the running result)."""
    plugin = algo(reading="ima_code", ima_code_server_lr=0.5)
    forward, _ = server_round(plugin)
    backward, _ = server_round(plugin, order=(2, 1, 0))
    assert torch.allclose(forward.params["w"], backward.params["w"], atol=1e-6)


def test_client_sends_its_delta_weighted_with_signs():
    """One full-batch SGD step on two examples: delta = lr * grad (the numpy reference)."""
    lr = 0.1
    plugin = algo(local={"lr": lr, "batch_size": 8})
    x, y = np.array([[1.0, 2.0], [-0.5, 1.0]]), np.array([0, 1])
    update = plugin.client_update(context(x, y, payload_of(plugin))).update
    gw, gb = grad(W0, B0, x, y)
    assert np.allclose(update.delta["weight"].numpy(), 2 * lr * gw, atol=1e-6)  # weighted by n = 2
    assert np.allclose(update.delta["bias"].numpy(), 2 * lr * gb, atol=1e-6)
    assert np.array_equal(update.sign["weight"].numpy(), np.sign(gw))
    assert float(update.weight) == 2.0 and float(update.count) == 1.0
    assert update.positive == {} and update.negative == {}  # the paper's reading needs no parts


def test_a_client_without_data_neither_votes_nor_weighs():
    plugin = algo()
    update = plugin.client_update(context(np.zeros((0, 2)), np.zeros(0), payload_of(plugin))).update
    assert float(update.count) == 0.0 and float(update.weight) == 0.0


def test_nobody_trained_keeps_the_model():
    plugin = algo()
    agg = plugin.aggregator()
    empty = plugin.client_update(context(np.zeros((0, 2)), np.zeros(0), payload_of(plugin)))
    acc = agg.add(agg.zero(), 0, empty)
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    state = plugin.init(params, RunInfo(num_clients=1, cohort_size=1, num_rounds=1, spec=SPEC, seed=0))
    new, metrics = plugin.server_update(state, agg.result(acc), 0, INFO)
    assert new is state and metrics == {}


def test_ima_code_reading_refuses_a_server_optimizer():
    with pytest.raises(ValidationError, match="leave server at its default"):
        algo(reading="ima_code", server={"kind": "adam"})
