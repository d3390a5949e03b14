"""FedDyn (Acar et al. 2021, Algorithm 1) against the numpy reference, over two rounds.

Client i from the global x with its g_i, K = 2 full-batch steps at lr eta on
L_i(w) - <g_i, w> + (alpha/2)||w - x||^2:
    y1 = x - eta (grad L_i(x) - g_i)                        (the proximal gradient is 0 at x)
    y2 = y1 - eta (grad L_i(y1) - g_i + alpha (y1 - x))
    g_i <- g_i - alpha (y2 - x)
Server over the reporting clients S of m = 4:
    h <- h - alpha (1/m) sum_S (y_i - x);   x <- mean_S(y_i) - h / alpha
With ``penalty: norm`` the proximal gradient is (alpha/2)(y1 - x)/||y1 - x|| (weight and bias
together). The weight and the bias follow the same rules; the reference tracks both.
"""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad

from raysim import params as P
from raysim import registry
from raysim.types import RunInfo

LR, ALPHA, M = 0.1, 0.5, 4
CLIENTS = {  # client id -> (x, y): 1, 2 and 3 examples
    0: (np.array([[1.0, 2.0]]), np.array([0])),
    1: (np.array([[-0.5, 1.0], [0.2, 0.4]]), np.array([1, 0])),
    2: (np.array([[0.3, -1.0], [1.5, 0.5], [-1.0, -0.2]]), np.array([1, 1, 0])),
}

INFO = RunInfo(num_clients=M, cohort_size=2, num_rounds=2, spec=SPEC, seed=0)  # the run's facts


def algo(**options):
    entry = registry.get("algorithm", "feddyn")
    config = {"alpha": ALPHA, "local": {"lr": LR, "batch_size": 8, "epochs": 2}}
    return entry.factory(entry.config.model_validate(config | options))


def init_state(plugin):
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    return plugin.init(params, RunInfo(num_clients=M, cohort_size=2, num_rounds=2, spec=SPEC, seed=0))


def reference_client(w_g, b_g, gi_w, gi_b, x, y, penalty="squared"):
    """(local w, local b, new g_i for w, for b) after K = 2 steps."""
    w, b = w_g.copy(), b_g.copy()
    for _ in range(2):
        gw, gb = grad(w, b, x, y)
        dw, db = w - w_g, b - b_g
        if penalty == "squared":
            scale = ALPHA
        else:
            norm = np.sqrt((dw**2).sum() + (db**2).sum())
            scale = ALPHA / 2 / norm if norm > 0 else 0.0
        w, b = w - LR * (gw - gi_w + scale * dw), b - LR * (gb - gi_b + scale * db)
    return w, b, gi_w - ALPHA * (w - w_g), gi_b - ALPHA * (b - b_g)


def run_client(plugin, state, client_id, client_state=None):
    x, y = CLIENTS[client_id]
    ctx = context(x, y, plugin.payload(state, 0, INFO), state=client_state, client_id=client_id)
    P.load_into(ctx.model, ctx.payload.params)  # as the worker does (the helper's model is at W0)
    return ctx, plugin.client_update(ctx)


def server_round(plugin, state, results):
    agg = plugin.aggregator()
    acc = agg.zero()
    for position, result in enumerate(results):
        acc = agg.add(acc, position, result)
    return plugin.server_update(state, agg.result(acc), 0, INFO)


@pytest.mark.parametrize("penalty", ["squared", "norm"])
def test_client_steps_and_its_linear_term(penalty):
    plugin = algo(reading={"squared": "paper", "norm": "fedgucci_code"}[penalty])
    gi = {"weight": torch.tensor([[0.02, -0.01], [0.0, 0.03]]), "bias": torch.tensor([0.01, -0.02])}
    _, result = run_client(plugin, init_state(plugin), 1, plugin.ClientState(gi))
    w, b, new_w, new_b = reference_client(
        W0, B0, gi["weight"].numpy(), gi["bias"].numpy(), *CLIENTS[1], penalty
    )
    assert np.allclose(result.update.delta["weight"].numpy(), W0 - w, atol=1e-6)
    assert np.allclose(result.update.delta["bias"].numpy(), B0 - b, atol=1e-6)
    assert np.allclose(result.state.g["weight"].numpy(), new_w, atol=1e-6)
    assert np.allclose(result.state.g["bias"].numpy(), new_b, atol=1e-6)


def test_the_norm_penalty_differs_from_the_squared_one():
    """Sanity of the test above: the two penalties give different steps on these numbers."""
    squared = reference_client(W0, B0, 0.0, 0.0, *CLIENTS[1])[0]
    norm = reference_client(W0, B0, 0.0, 0.0, *CLIENTS[1], penalty="norm")[0]
    assert np.abs(squared - norm).max() > 1e-4


@pytest.mark.parametrize("weighted", [False, True])
def test_two_rounds_of_h_and_the_global_model(weighted):
    """Round 0: clients 0 and 1 (fresh); round 1: client 1 again (with its g_i) and client 2.

    Weighted: (1/m) sum_S becomes (|S|/m) sum_S p_i and mean_S becomes sum_S p_i, p_i = n_i / n.
    """
    plugin = algo(weighted=weighted)
    state = init_state(plugin)
    w_g, b_g, h_w, h_b = W0.copy(), B0.copy(), np.zeros_like(W0), np.zeros_like(B0)
    kept, ref_g = {}, {c: (np.zeros_like(W0), np.zeros_like(B0)) for c in CLIENTS}
    for cohort in ([0, 1], [1, 2]):
        results = []
        for c in cohort:
            _, result = run_client(plugin, state, c, kept.get(c))
            kept[c] = result.state
            results.append(result)
        state, metrics = server_round(plugin, state, results)
        locals_ = {c: reference_client(w_g, b_g, *ref_g[c], *CLIENTS[c]) for c in cohort}
        ref_g |= {c: (v[2], v[3]) for c, v in locals_.items()}
        n = np.array([len(CLIENTS[c][1]) for c in cohort], float)
        p = n / n.sum() if weighted else np.full(len(cohort), 1 / len(cohort))
        mean_w = sum(pi * locals_[c][0] for pi, c in zip(p, cohort))
        mean_b = sum(pi * locals_[c][1] for pi, c in zip(p, cohort))
        share = len(cohort) / M
        h_w = h_w - ALPHA * share * sum(pi * (locals_[c][0] - w_g) for pi, c in zip(p, cohort))
        h_b = h_b - ALPHA * share * sum(pi * (locals_[c][1] - b_g) for pi, c in zip(p, cohort))
        w_g, b_g = mean_w - h_w / ALPHA, mean_b - h_b / ALPHA
        assert np.allclose(state.extra.h["weight"].numpy(), h_w, atol=1e-6)
        assert np.allclose(state.extra.h["bias"].numpy(), h_b, atol=1e-6)
        assert np.allclose(state.params["weight"].numpy(), w_g, atol=1e-5)
        assert np.allclose(state.params["bias"].numpy(), b_g, atol=1e-5)
        assert metrics["feddyn/h_norm"] == pytest.approx(np.sqrt((h_w**2).sum() + (h_b**2).sum()), rel=1e-5)
    assert np.abs(h_w).max() > 1e-3  # h moved, so the check above could fail


def test_pseudo_gradient_is_the_mean_delta_and_buffers_take_the_plain_mean():
    """The pure aggregate is mean(w_i); a float buffer gets no h (it is not trained)."""
    plugin = algo()
    params = {"weight": torch.ones(2), "running_mean": torch.zeros(2)}
    info = RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)
    state = plugin.init(params, replace(info, buffer_keys=frozenset({"running_mean"})))
    assert set(state.extra.h) == {"weight"}
    update_type = type(run_client(plugin, init_state(plugin), 0)[1].update)
    sums = update_type(
        delta={"weight": torch.tensor([0.2, 0.4]), "running_mean": torch.tensor([-1.0, 1.0])},
        weight=torch.tensor(2.0),
        count=torch.tensor(2.0),
    )
    mean_delta = {"weight": torch.tensor([0.1, 0.2]), "running_mean": torch.tensor([-0.5, 0.5])}
    for k, v in plugin.pseudo_gradient(sums).items():
        torch.testing.assert_close(v, mean_delta[k])
    new, _ = plugin.server_update(state, sums, 0, info)
    h = ALPHA * 1.0 * mean_delta["weight"]  # |S|/m = 1
    torch.testing.assert_close(new.params["weight"], 1 - mean_delta["weight"] - h / ALPHA)
    torch.testing.assert_close(new.params["running_mean"], torch.tensor([0.5, -0.5]))


def test_a_client_without_examples_takes_no_step_and_weighs_nothing():
    """No data: no step, so w_i = w_g, delta 0, g_i stays 0 (g - alpha (w_i - w_g)), weight 0.
    Unweighted, it is one of S with w_i = w_g, as the paper's mean over S has it; weighted
    (p_i = n_i / n), it adds nothing: the round is client 1's alone."""
    empty = (np.zeros((0, 2)), np.zeros(0, dtype=np.int64))
    for weighted in (False, True):
        plugin = algo(weighted=weighted)
        state = init_state(plugin)
        ctx = context(*empty, plugin.payload(state, 0, INFO), client_id=3)
        P.load_into(ctx.model, ctx.payload.params)
        result = plugin.client_update(ctx)
        assert result.weight == 0.0 and P.is_finite(result.update)
        assert all(float(v.abs().max()) == 0 for v in result.update.delta.values())
        assert all(float(v.abs().max()) == 0 for v in result.state.g.values())
        _, one = run_client(plugin, state, 1)
        new, metrics = server_round(plugin, state, [one, result])
        assert all(math.isfinite(v) for v in metrics.values())
        w1, b1, _, _ = reference_client(W0, B0, 0.0, 0.0, *CLIENTS[1])
        p1 = 1.0 if weighted else 0.5  # the empty client's w_i = W0 takes the other half
        mean_w, mean_b = p1 * w1 + (1 - p1) * W0, p1 * b1 + (1 - p1) * B0
        share = 2 / M
        h_w, h_b = -ALPHA * share * p1 * (w1 - W0), -ALPHA * share * p1 * (b1 - B0)
        assert np.allclose(new.params["weight"].numpy(), mean_w - h_w / ALPHA, atol=1e-5)
        assert np.allclose(new.params["bias"].numpy(), mean_b - h_b / ALPHA, atol=1e-5)
