"""FedRep's two phases against a plain autograd reference.

Model (feature_reference.TwoLayer): features f = x V^T, logits f W^T + b. Full batches, so an
epoch is one SGD step on the mean cross-entropy:
    head phase, head_epochs steps:  (W, b) -= lr * grad_(W, b) CE(x V0^T W^T + b, y)   (V0 frozen)
    body phase, local.epochs steps: V      -= lr * grad_V CE(x V^T W'^T + b', y)        (W', b' frozen)
The client sends V0 - V alone and keeps (W', b'), starting from its state's head when it has one.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from feature_reference import B0, SPEC3, V0, W0, feature_context

from raysim import params as P
from raysim import registry
from raysim.types import RunInfo

LR = 0.5
X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -0.7]])
Y = np.array([0, 2, 1])

INFO = RunInfo(2, 2, 1, SPEC3, 0)  # the run's facts


def algo(head_epochs=2, epochs=1):
    entry = registry.get("algorithm", "fedrep")
    local = {"lr": LR, "batch_size": 8, "epochs": epochs}
    return entry.factory(entry.config.model_validate({"head_epochs": head_epochs, "local": local}))


def nll(logits, y):
    return -logits.log_softmax(dim=1)[torch.arange(len(y)), y].mean()


def reference(head_epochs, epochs, head=(W0, B0)):
    x, y = torch.tensor(X), torch.tensor(Y)
    v = torch.tensor(V0, requires_grad=True)
    w, b = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in head)
    for _ in range(head_epochs):
        gw, gb = torch.autograd.grad(nll(x @ v.detach().T @ w.T + b, y), (w, b))
        with torch.no_grad():
            w -= LR * gw
            b -= LR * gb
    for _ in range(epochs):
        (gv,) = torch.autograd.grad(nll(x @ v.T @ w.detach().T + b.detach(), y), (v,))
        with torch.no_grad():
            v -= LR * gv
    return v.detach().numpy(), w.detach().numpy(), b.detach().numpy()


@pytest.mark.parametrize(("head_epochs", "epochs"), [(1, 1), (2, 3)])
def test_the_head_trains_first_then_the_body_and_only_the_body_is_sent(head_epochs, epochs):
    result = algo(head_epochs, epochs).client_update(feature_context(X, Y))
    v, w, b = reference(head_epochs, epochs)
    assert set(result.update) == {"body.weight"}
    assert np.allclose(result.update["body.weight"].numpy(), V0 - v, atol=1e-5)
    assert np.allclose(result.state.head["weight"].numpy(), w, atol=1e-5)
    assert np.allclose(result.state.head["bias"].numpy(), b, atol=1e-5)
    assert result.weight == 3.0 and np.isfinite(result.metrics["fedrep/head_loss"])


def test_a_client_starts_from_its_own_head_and_its_model_keeps_its_flags():
    start = (W0 * 0.5 + 0.1, B0 - 0.2)
    plugin = algo()
    state = plugin.ClientState(
        {"weight": torch.tensor(start[0]).float(), "bias": torch.tensor(start[1]).float()}
    )
    ctx = feature_context(X, Y, state=state)
    result = plugin.client_update(ctx)
    v, w, _ = reference(2, 1, head=start)
    assert np.allclose(result.update["body.weight"].numpy(), V0 - v, atol=1e-5)
    assert np.allclose(result.state.head["weight"].numpy(), w, atol=1e-5)
    assert all(p.requires_grad for p in ctx.model.parameters())  # frozen only while training


def test_the_personal_model_has_the_clients_head_and_the_server_averages_bodies():
    plugin = algo()
    head = {"weight": torch.tensor(W0 * 2).float(), "bias": torch.tensor(B0).float()}
    model = plugin.personal_model(feature_context(X, Y, state=plugin.ClientState(head)))
    assert torch.equal(model.head.weight, head["weight"])
    assert np.allclose(model.body.weight.detach().numpy(), V0)

    params = {k: v.float() for k, v in feature_context(X, Y).global_params.items()}
    state = plugin.init(P.clone(params), RunInfo(2, 2, 1, SPEC3, 0))
    agg, acc = plugin.aggregator(), plugin.aggregator().zero()
    results = [plugin.client_update(feature_context(X[:k], Y[:k])) for k in (2, 3)]
    for i, result in enumerate(results):
        acc = agg.add(acc, i, result)
    new, _ = plugin.server_update(state, agg.result(acc), 0, INFO)
    mean = (2 * results[0].update["body.weight"] + 3 * results[1].update["body.weight"]) / 5
    assert torch.allclose(new.params["body.weight"], params["body.weight"] - mean, atol=1e-6)
    assert torch.equal(new.params["head.weight"], params["head.weight"])  # the global head never trains


def test_a_step_budget_covers_both_phases_the_heads_first():
    """A budget of 2 batches with head_epochs 2 (one full batch an epoch) is spent on the head:
    the body takes no step, so the client sends a zero delta; a budget of 3 leaves the body one."""
    spent = algo(head_epochs=2, epochs=3).client_update(replace(feature_context(X, Y), step_budget=2))
    assert torch.count_nonzero(spent.update["body.weight"]) == 0 and spent.metrics["train/steps"] == 0
    one_left = algo(head_epochs=2, epochs=3).client_update(replace(feature_context(X, Y), step_budget=3))
    v, _, _ = reference(2, 1)
    assert np.allclose(one_left.update["body.weight"].numpy(), V0 - v, atol=1e-5)
