"""FedRoD's balanced softmax and its two steps per batch, against a torch autograd reference.

Model: features f = x V^T, generic logits g = f W^T + b (feature_reference.TwoLayer); personal
head (P, c). Per batch (here the whole client, so each epoch is one step), with n the client's
label counts:
    generic:  (V, W, b) -= lr * grad CE(g + log n, y)
    personal: (P, c)    -= lr * grad CE(g' + f' P^T + c, y), f' and g' the generic step's
              forward pass, detached (so they carry no gradient to V, W, b)
The client sends (V0 - V, W0 - W, b0 - b), keeps (P, c) and reports the accuracy of
argmax(g + f P^T + c) at the trained weights on its (training) data.

With ``absent_class_count: 1`` (FedGuCci's code) a class without examples counts n_c = 1, so
log n_c = 0 instead of -inf.
"""

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from feature_reference import B0, SPEC3, V0, W0, feature_context, reference_params

from raysim import registry
from raysim.types import RunInfo

LR = 0.5
X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -0.7]])
Y = np.array([0, 0, 1])  # class 2 absent: n = [2, 1, 0], log n_2 = -inf
COUNTS = np.array([2.0, 1.0, 0.0])

INFO = RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC3, seed=0)  # the run's facts


def plugin_module():
    return importlib.import_module(registry.get("algorithm", "fedrod").factory.__module__)


def algo(epochs=2, **options):
    entry = registry.get("algorithm", "fedrod")
    local = {"lr": LR, "batch_size": 8, "epochs": epochs}
    return entry.factory(entry.config.model_validate({"local": local, **options}))


def nll(logits, y):
    return -logits.log_softmax(dim=1)[torch.arange(len(y)), y].mean()


def reference_client(steps, personal_start=(W0, B0), counts=COUNTS):
    x, y = torch.tensor(X), torch.tensor(Y)
    v, w, b = reference_params()
    p, c = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in personal_start]
    log_n = torch.tensor(counts).log()
    for _ in range(steps):
        f = x @ v.T
        g = f @ w.T + b
        grads = torch.autograd.grad(nll(g + log_n, y), (v, w, b))
        personal_grads = torch.autograd.grad(nll(g.detach() + f.detach() @ p.T + c, y), (p, c))
        with torch.no_grad():
            for t, gt in zip((v, w, b, p, c), grads + personal_grads):
                t -= LR * gt
    with torch.no_grad():
        f = x @ v.T
        accuracy = float(((f @ w.T + b + f @ p.T + c).argmax(1) == y).double().mean())
    return [t.detach().numpy() for t in (v, w, b, p, c)], accuracy


def test_balanced_softmax_by_hand():
    module = plugin_module()
    logits = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 0.5]])
    counts = torch.tensor([3.0, 1.0, 0.0])
    # row 1: softmax of [1 + log 3, 0, -inf] at class 0 = 3e / (3e + 1); row 2: 3 / 4 at class 0
    expected = -(np.log(3 * np.e / (3 * np.e + 1)) + np.log(3 / 4)) / 2
    loss = module.balanced_softmax_loss(logits, torch.tensor([0, 0]), counts)
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_balanced_softmax_with_fedguccis_absent_class_count_by_hand():
    """FedGuCci's code: n_2 = 1 for the absent class, log 1 = 0, so its raw logit stays."""
    module = plugin_module()
    data = feature_context(X, Y).data
    assert torch.equal(module.class_counts(data, 3), torch.tensor([2.0, 1.0, 0.0]))
    assert torch.equal(module.class_counts(data, 3, absent=1), torch.tensor([2.0, 1.0, 1.0]))
    logits = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 0.5]])
    # row 1: softmax of [1 + log 3, 0, 2] at class 0 = 3e / (3e + 1 + e^2); row 2: 3 / 5
    expected = -(np.log(3 * np.e / (3 * np.e + 1 + np.e**2)) + np.log(3 / 5)) / 2
    loss = module.balanced_softmax_loss(logits, torch.tensor([0, 0]), torch.tensor([3.0, 1.0, 1.0]))
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_absent_class_count_accepts_only_0_or_1():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="absent_class_count"):
        algo(absent_class_count=2)


@pytest.mark.parametrize(
    ("epochs", "absent", "counts"),
    [(1, 0, COUNTS), (2, 0, COUNTS), (2, 1, np.array([2.0, 1.0, 1.0]))],
)
def test_generic_and_personal_steps_match_the_reference(epochs, absent, counts):
    result = algo(epochs, absent_class_count=absent).client_update(feature_context(X, Y))
    (v, w, b, p, c), accuracy = reference_client(epochs, counts=counts)
    assert np.allclose(result.update["body.weight"].numpy(), V0 - v, atol=1e-5)
    assert np.allclose(result.update["head.weight"].numpy(), W0 - w, atol=1e-5)
    assert np.allclose(result.update["head.bias"].numpy(), B0 - b, atol=1e-5)
    assert np.allclose(result.state.head["weight"].numpy(), p, atol=1e-5)
    assert np.allclose(result.state.head["bias"].numpy(), c, atol=1e-5)
    assert result.metrics["fedrod/personal_train_accuracy"] == pytest.approx(accuracy)
    assert np.isfinite(result.metrics["train/loss"]) and result.weight == 3.0


def test_the_personal_head_comes_back_from_the_client_state():
    start = (W0 * 0.5 + 0.1, B0 - 0.2)
    plugin = algo(1)
    head = {"weight": torch.tensor(start[0]).float(), "bias": torch.tensor(start[1]).float()}
    state = plugin.ClientState(head)
    result = plugin.client_update(feature_context(X, Y, state=state))
    (_, w, _, p, c), _ = reference_client(1, personal_start=start)
    assert np.allclose(result.state.head["weight"].numpy(), p, atol=1e-5)
    assert np.allclose(result.state.head["bias"].numpy(), c, atol=1e-5)
    assert np.allclose(result.update["head.weight"].numpy(), W0 - w, atol=1e-5)  # generic: unchanged


def test_the_server_averages_the_generic_model():
    plugin = algo(1)
    model_params = {k: v.float() for k, v in feature_context(X, Y).global_params.items()}
    state = plugin.init(model_params, RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC3, seed=0))
    agg = plugin.aggregator()
    acc = agg.zero()
    results = [plugin.client_update(feature_context(X[:k], Y[:k])) for k in (2, 3)]
    for i, result in enumerate(results):
        acc = agg.add(acc, i, result)
    new, _ = plugin.server_update(state, agg.result(acc), 0, INFO)
    mean = (2 * results[0].update["head.weight"] + 3 * results[1].update["head.weight"]) / 5
    assert torch.allclose(new.params["head.weight"], torch.tensor(W0).float() - mean, atol=1e-6)


def test_regression_tasks_are_refused():
    from raysim.errors import ConfigError
    from raysim.types import DataSpec

    spec = DataSpec(task="regression", input_shape=(2,), num_classes=1)
    with pytest.raises(ConfigError, match="needs a classification task"):
        algo().init({}, RunInfo(num_clients=1, cohort_size=1, num_rounds=1, spec=spec, seed=0))


def test_balanced_softmax_gives_no_gradient_to_an_absent_class():
    """log 0 = -inf: the class's probability is 0, so its logit's gradient is exactly 0."""
    logits = torch.zeros(2, 3, requires_grad=True)
    module = plugin_module()
    module.balanced_softmax_loss(logits, torch.tensor([0, 1]), torch.tensor([1.0, 1.0, 0.0])).backward()
    assert torch.all(logits.grad[:, 2] == 0) and torch.isfinite(logits.grad).all()
    assert F.softmax(logits.detach() + torch.tensor([1.0, 1.0, 0.0]).log(), 1)[0, 2] == 0


def test_a_model_without_features_is_refused():
    from reference import context, payload

    with pytest.raises(TypeError, match=r"fedrod needs a model with features\(x\) and head"):
        algo().client_update(context([[1.0, 2.0]], [0], payload()))


def test_the_personal_model_adds_the_clients_head_to_the_generic_model():
    """personal_model(x) = f W0^T + b0 + f P^T + c with f = x V0^T; without state P, c = W0, b0."""
    x = np.array([[1.0, -1.0], [0.2, 0.4]])
    f = x @ V0.T
    p, c = W0 * 0.5 + 0.1, B0 - 0.2
    plugin = algo(1)
    state = plugin.ClientState({"weight": torch.tensor(p).float(), "bias": torch.tensor(c).float()})
    with torch.no_grad():
        personal = plugin.personal_model(feature_context(X, Y, state=state))(torch.tensor(x).float())
        fresh = plugin.personal_model(feature_context(X, Y))(torch.tensor(x).float())
    assert np.allclose(personal.numpy(), f @ W0.T + B0 + f @ p.T + c, atol=1e-6)
    assert np.allclose(fresh.numpy(), 2 * (f @ W0.T + B0), atol=1e-6)
