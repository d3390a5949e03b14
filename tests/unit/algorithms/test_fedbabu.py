"""FedBABU against a plain autograd reference.

Model (feature_reference.TwoLayer): features f = x V^T, logits f W^T + b. Full batches, so an
epoch is one SGD step on the mean cross-entropy:
    client, local.epochs steps:   V -= lr * grad_V CE(x V^T W0^T + b0, y)     (head frozen at W0, b0)
    fine-tune, finetune_epochs:   (W, b) -= lr * grad CE(x V0^T W^T + b, y)   ("head")
                                  (V, W, b) -= lr * grad CE(x V^T W^T + b, y) ("full")
The client sends V0 - V alone; the server's head never moves.
"""

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


def algo(epochs=1, **options):
    entry = registry.get("algorithm", "fedbabu")
    local = {"lr": LR, "batch_size": 8, "epochs": epochs}
    return entry.factory(entry.config.model_validate({"local": local, **options}))


def nll(logits, y):
    return -logits.log_softmax(dim=1)[torch.arange(len(y)), y].mean()


def reference(steps, trains):
    """(V, W, b) after ``steps`` full-batch steps of the tensors named in ``trains``."""
    x, y = torch.tensor(X), torch.tensor(Y)
    tensors = {
        name: torch.tensor(a, dtype=torch.float64, requires_grad=True) for name, a in zip("vwb", (V0, W0, B0))
    }
    for _ in range(steps):
        v, w, b = tensors.values()
        grads = torch.autograd.grad(nll(x @ v.T @ w.T + b, y), [tensors[n] for n in trains])
        with torch.no_grad():
            for name, g in zip(trains, grads):
                tensors[name] -= LR * g
    return [t.detach().numpy() for t in tensors.values()]


@pytest.mark.parametrize("epochs", [1, 3])
def test_the_body_trains_under_the_frozen_head_and_only_the_body_is_sent(epochs):
    ctx = feature_context(X, Y)
    result = algo(epochs).client_update(ctx)
    v, _, _ = reference(epochs, "v")
    assert set(result.update) == {"body.weight"}
    assert np.allclose(result.update["body.weight"].numpy(), V0 - v, atol=1e-5)
    assert np.allclose(ctx.model.head.weight.detach().numpy(), W0)  # the head did not train
    assert all(p.requires_grad for p in ctx.model.parameters()) and result.weight == 3.0


@pytest.mark.parametrize(("part", "trains"), [("head", "wb"), ("full", "vwb")])
def test_the_personal_model_is_the_global_model_fine_tuned(part, trains):
    model = algo(finetune_epochs=2, finetune_part=part).personal_model(feature_context(X, Y))
    v, w, b = reference(2, trains)
    assert np.allclose(model.body.weight.detach().numpy(), v, atol=1e-5)
    assert np.allclose(model.head.weight.detach().numpy(), w, atol=1e-5)
    assert np.allclose(model.head.bias.detach().numpy(), b, atol=1e-5)


def test_the_server_averages_bodies_and_keeps_the_initial_head():
    plugin = algo()
    params = {k: v.float() for k, v in feature_context(X, Y).global_params.items()}
    state = plugin.init(P.clone(params), RunInfo(2, 2, 1, SPEC3, 0))
    agg, acc = plugin.aggregator(), plugin.aggregator().zero()
    results = [plugin.client_update(feature_context(X[:k], Y[:k])) for k in (2, 3)]
    for i, result in enumerate(results):
        acc = agg.add(acc, i, result)
    new, _ = plugin.server_update(state, agg.result(acc), 0, INFO)
    mean = (2 * results[0].update["body.weight"] + 3 * results[1].update["body.weight"]) / 5
    assert torch.allclose(new.params["body.weight"], params["body.weight"] - mean, atol=1e-6)
    assert torch.equal(new.params["head.weight"], params["head.weight"])
