"""FedNova (Wang et al. 2020) against the numpy reference.

Local SGD with momentum rho (torch's: buf <- rho buf + g; w <- w - lr buf) for tau steps puts the
gradient of step s into ``w_g - w_tau`` with weight lr * sum_{j=0}^{tau-s} rho^j, so in all
    a = sum_{s=1}^{tau} sum_{j=0}^{tau-s} rho^j = [tau - rho (1 - rho^tau)/(1 - rho)] / (1 - rho).
Each client sends d_i = (w_g - w_i) / a_i; with p_i = n_i / sum n over the cohort the server steps
    w_g <- w_g - server_lr * (sum_i p_i a_i) * sum_i p_i d_i.
A client's examples here are copies of one example, so its steps do not depend on the shuffling:
tau_i = n_i with batch size 1.
"""

import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from reference import B0, SPEC, W0, context, grad

from raysim import registry
from raysim.types import RunInfo

LR, RHO = 0.1, 0.9
CLIENTS = [  # (example, label, copies): tau = 2 and tau = 5
    (np.array([1.0, 2.0]), 0, 2),
    (np.array([-0.5, 1.0]), 1, 5),
]

INFO = RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)  # the run's facts


def algo(**options):
    entry = registry.get("algorithm", "fednova")
    config = {"local": {"lr": LR, "batch_size": 1, "momentum": RHO}}
    return entry.factory(entry.config.model_validate(config | options))


def momentum_steps(tau, rho):
    return sys.modules[registry.get("algorithm", "fednova").factory.__module__].momentum_steps(tau, rho)


def init_state(plugin):
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    return plugin.init(params, RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=SPEC, seed=0))


def client_data(example, label, copies):
    return np.tile(example, (copies, 1)), np.full(copies, label)


def reference_client(example, label, copies, rho=RHO):
    """(w_g - w, b_g - b) after ``copies`` momentum-SGD steps on the one example."""
    x, y = example[None], np.array([label])
    w, b = W0.copy(), B0.copy()
    buf_w, buf_b = np.zeros_like(w), np.zeros_like(b)
    for _ in range(copies):
        gw, gb = grad(w, b, x, y)
        buf_w, buf_b = rho * buf_w + gw, rho * buf_b + gb
        w, b = w - LR * buf_w, b - LR * buf_b
    return W0 - w, B0 - b


@pytest.mark.parametrize("tau", [1, 2, 5, 17])
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_a_is_the_summed_weight_of_the_gradients(tau, rho):
    by_sum = sum(sum(rho**j for j in range(tau - s + 1)) for s in range(1, tau + 1))
    assert momentum_steps(tau, rho) == pytest.approx(by_sum, rel=1e-12)


def test_a_is_what_torch_momentum_sgd_moves_under_a_constant_gradient():
    """With a constant gradient g, tau steps of torch's SGD move the weights by lr * a * g."""
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=LR, momentum=RHO)
    for _ in range(7):
        optimizer.zero_grad()
        (3.0 * w).sum().backward()  # g = 3
        optimizer.step()
    assert float(-w.detach()) == pytest.approx(LR * momentum_steps(7, RHO) * 3.0, rel=1e-12)


def test_client_sends_its_normalized_move():
    plugin = algo()
    example, label, copies = CLIENTS[1]
    result = plugin.client_update(
        context(*client_data(example, label, copies), plugin.payload(init_state(plugin), 0, INFO))
    )
    dw, db = reference_client(example, label, copies)
    a = momentum_steps(copies, RHO)
    assert float(result.update.weight) == copies and float(result.update.steps) == pytest.approx(copies * a)
    assert np.allclose(result.update.normalized["weight"].numpy(), copies * dw / a, atol=1e-6)
    assert np.allclose(result.update.normalized["bias"].numpy(), copies * db / a, atol=1e-6)
    assert result.update.buffers == {}


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_server_step_is_tau_eff_times_the_mean_normalized_move(server_lr):
    plugin = algo(server={"lr": server_lr})
    state = init_state(plugin)
    agg = plugin.aggregator()
    acc = agg.zero()
    for position, (example, label, copies) in enumerate(CLIENTS):
        ctx = context(*client_data(example, label, copies), plugin.payload(state, 0, INFO))
        acc = agg.add(acc, position, plugin.client_update(ctx))
    new, metrics = plugin.server_update(state, agg.result(acc), 0, INFO)

    n = np.array([copies for _, _, copies in CLIENTS], float)
    p = n / n.sum()
    a = np.array([momentum_steps(int(k), RHO) for k in n])
    moves = [reference_client(*client) for client in CLIENTS]
    tau_eff = (p * a).sum()
    step_w = tau_eff * sum(pi * dw / ai for pi, ai, (dw, _) in zip(p, a, moves))
    step_b = tau_eff * sum(pi * db / ai for pi, ai, (_, db) in zip(p, a, moves))
    assert metrics["fednova/tau_eff"] == pytest.approx(tau_eff, rel=1e-6)
    assert np.allclose(new.params["weight"].numpy(), W0 - server_lr * step_w, atol=1e-6)
    assert np.allclose(new.params["bias"].numpy(), B0 - server_lr * step_b, atol=1e-6)
    fedavg_w = sum(pi * dw for pi, (dw, _) in zip(p, moves))
    assert np.abs(step_w - fedavg_w).max() > 1e-3  # unequal steps: FedNova is not FedAvg here
    pseudo = plugin.pseudo_gradient(agg.result(acc))
    assert np.allclose(pseudo["weight"].numpy(), step_w, atol=1e-6)


def test_buffers_take_the_plain_weighted_mean():
    plugin = algo()
    example, label, copies = CLIENTS[0]
    ctx = context(*client_data(example, label, copies), plugin.payload(init_state(plugin), 0, INFO))
    sums = type(plugin.client_update(ctx).update)(
        normalized={"weight": torch.tensor([1.0])},
        buffers={"running_mean": torch.tensor([6.0])},
        weight=torch.tensor(3.0),
        steps=torch.tensor(12.0),  # tau_eff = 4
    )
    pseudo = plugin.pseudo_gradient(sums)
    torch.testing.assert_close(pseudo["weight"], torch.tensor([4.0 / 3.0]))
    torch.testing.assert_close(pseudo["running_mean"], torch.tensor([2.0]))


def test_local_adam_is_refused():
    config = registry.get("algorithm", "fednova").config
    with pytest.raises(ValidationError, match="local.optimizer to sgd"):
        config.model_validate({"local": {"optimizer": "adam"}})


def test_a_client_without_examples_weighs_nothing():
    """No data: tau = 0, a = 0, so the client sends zeros with weight 0 (no division by a) and the
    server's step is the other client's alone."""
    plugin = algo()
    state = init_state(plugin)
    empty = plugin.client_update(
        context(np.zeros((0, 2)), np.zeros(0, np.int64), plugin.payload(state, 0, INFO))
    )
    assert empty.weight == 0.0 and float(empty.update.weight) == 0 and float(empty.update.steps) == 0
    assert all(torch.isfinite(v).all() and not v.any() for v in empty.update.normalized.values())
    example, label, copies = CLIENTS[1]
    one = plugin.client_update(context(*client_data(example, label, copies), plugin.payload(state, 0, INFO)))

    def server(results):
        agg = plugin.aggregator()
        acc = agg.zero()
        for position, result in enumerate(results):
            acc = agg.add(acc, position, result)
        return plugin.server_update(state, agg.result(acc), 0, INFO)

    (with_empty, metrics), (alone, _) = server([one, empty]), server([one])
    dw, db = reference_client(example, label, copies)  # a single client: FedNova steps by its move
    assert metrics["fednova/tau_eff"] == pytest.approx(momentum_steps(copies, RHO))
    assert np.allclose(with_empty.params["weight"].numpy(), W0 - dw, atol=1e-6)
    assert np.allclose(with_empty.params["bias"].numpy(), B0 - db, atol=1e-6)
    torch.testing.assert_close(with_empty.params, alone.params)
    assert server([empty])[0] is state  # nothing at all to step on


def test_a_client_cut_short_by_max_steps_weighs_by_its_data_size():
    """The paper's p_i = n_i / sum n is by data size (Wang et al. 2020 and the authors' code),
    whatever part of its data a client's steps visited. Here ``max_steps = 3`` at batch size 1 cuts
    the 7-example client to 3 steps (3 examples visited), while the 2-example client finishes its
    epoch in 2: p = (7/9, 2/9), not the visited (3/5, 2/5). The reference recomputes everything
    from the paper: a_i as the double sum of rho^j over tau_i = min(n_i, 3) steps, each client's
    move by numpy momentum SGD, and the server step tau_eff * sum_i p_i d_i."""
    max_steps = 3
    clients = [(np.array([1.0, 2.0]), 0, 7), (np.array([-0.5, 1.0]), 1, 2)]
    plugin = algo(local={"lr": LR, "batch_size": 1, "momentum": RHO, "max_steps": max_steps})
    state = init_state(plugin)
    agg = plugin.aggregator()
    acc = agg.zero()
    for position, (example, label, copies) in enumerate(clients):
        ctx = context(*client_data(example, label, copies), plugin.payload(state, 0, INFO))
        acc = agg.add(acc, position, plugin.client_update(ctx))
    new, metrics = plugin.server_update(state, agg.result(acc), 0, INFO)

    n = np.array([copies for _, _, copies in clients], float)
    tau = np.minimum(n, max_steps).astype(int)
    p = n / n.sum()
    a = np.array([sum(RHO**j for s in range(1, t + 1) for j in range(t - s + 1)) for t in tau])
    moves = [reference_client(example, label, t) for (example, label, _), t in zip(clients, tau)]
    tau_eff = (p * a).sum()
    step_w = tau_eff * sum(pi * dw / ai for pi, ai, (dw, _) in zip(p, a, moves))
    step_b = tau_eff * sum(pi * db / ai for pi, ai, (_, db) in zip(p, a, moves))
    assert metrics["fednova/tau_eff"] == pytest.approx(tau_eff, rel=1e-6)
    assert np.allclose(new.params["weight"].numpy(), W0 - step_w, atol=1e-6)
    assert np.allclose(new.params["bias"].numpy(), B0 - step_b, atol=1e-6)
    visited = np.minimum(n, max_steps) / np.minimum(n, max_steps).sum()
    by_visits = (visited * a).sum() * sum(v * dw / ai for v, ai, (dw, _) in zip(visited, a, moves))
    assert np.abs(step_w - by_visits).max() > 1e-3  # the two weightings differ here
