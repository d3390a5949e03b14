"""FedBN against a plain autograd reference of one full-batch step of a model with BatchNorm.

Model: h = x W1^T + b1; BatchNorm in train mode hn = gamma (h - mean h) / sqrt(var h + eps) + beta
(batch mean, biased variance); logits = hn W2^T + b2. The running statistics move by momentum 0.1
towards the batch mean and the unbiased batch variance. A client with state (gamma', beta', rm',
rv') starts from the global (W1, b1, W2, b2) and its own BatchNorm, takes one SGD step on the mean
cross-entropy, sends (W1, b1, W2, b2)_global - (W1, b1, W2, b2)_trained and keeps its BatchNorm.
"""

import numpy as np
import pytest
import torch
from torch import nn

from raysim import params as P
from raysim import registry
from raysim.errors import ConfigError
from raysim.types import ClientContext, ClientData, DataSpec, Payload, RunInfo

SPEC = DataSpec(task="classification", input_shape=(2,), num_classes=3)
LR = 0.5
X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -0.7], [0.8, 0.1]])
Y = np.array([0, 2, 1, 1])
BN_NAMES = {"1.weight", "1.bias", "1.running_mean", "1.running_var"}

INFO = RunInfo(2, 2, 1, SPEC, 0)  # the run's facts


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 3))


def own_batchnorm() -> dict[str, torch.Tensor]:
    return {
        "1.weight": torch.tensor([1.5, 0.5, -1.0]),
        "1.bias": torch.tensor([0.1, -0.2, 0.3]),
        "1.running_mean": torch.tensor([0.2, 0.0, -0.1]),
        "1.running_var": torch.tensor([2.0, 0.5, 1.0]),
    }


def algo():
    entry = registry.get("algorithm", "fedbn")
    return entry.factory(entry.config.model_validate({"local": {"lr": LR, "batch_size": 8, "epochs": 1}}))


def context(state=None, x=X, y=Y) -> ClientContext:
    model = bn_model()
    global_params = P.clone(P.model_params(model))
    return ClientContext(
        client_id=0, round_num=0, model=model, payload=Payload(P.to_numpy(global_params)),
        global_params=global_params,
        data=ClientData({"x": np.asarray(x, np.float32), "y": np.asarray(y, np.int64)}),
        state=state, seed=0, device=torch.device("cpu"), spec=SPEC,
    )  # fmt: skip


def reference_step(global_params, bn):
    """One SGD step by hand (float64); returns the trained linear weights and BatchNorm."""
    g = {k: v.double().clone().requires_grad_(True) for k, v in global_params.items() if k not in BN_NAMES}
    gamma, beta = (bn[k].double().clone().requires_grad_(True) for k in ("1.weight", "1.bias"))
    x, y = torch.tensor(X), torch.tensor(Y)
    h = x @ g["0.weight"].T + g["0.bias"]
    mean, var = h.mean(0), h.var(0, unbiased=False)
    logits = (gamma * (h - mean) / torch.sqrt(var + 1e-5) + beta) @ g["2.weight"].T + g["2.bias"]
    loss = -logits.log_softmax(1)[torch.arange(len(Y)), y].mean()
    names = [*g, "1.weight", "1.bias"]
    grads = torch.autograd.grad(loss, [*g.values(), gamma, beta])
    trained = {k: (t - LR * d).detach() for k, t, d in zip(names, [*g.values(), gamma, beta], grads)}
    trained["1.running_mean"] = 0.9 * bn["1.running_mean"].double() + 0.1 * mean.detach()
    trained["1.running_var"] = 0.9 * bn["1.running_var"].double() + 0.1 * h.detach().var(0, unbiased=True)
    return trained


def test_a_client_trains_from_its_own_batchnorm_sends_the_rest_and_keeps_its_batchnorm():
    plugin = algo()
    ctx = context(plugin.ClientState(own_batchnorm()))
    result = plugin.client_update(ctx)
    expected = reference_step(ctx.global_params, own_batchnorm())
    assert set(result.update) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for name, delta in result.update.items():
        want = ctx.global_params[name].double() - expected[name]
        assert np.allclose(delta.numpy(), want.numpy(), atol=1e-5), name
    assert set(result.state.layers) == BN_NAMES
    for name, value in result.state.layers.items():
        assert np.allclose(value.numpy(), expected[name].numpy(), atol=1e-5), name


def test_the_first_time_a_client_starts_from_the_global_batchnorm():
    ctx = context()
    result = algo().client_update(ctx)
    expected = reference_step(ctx.global_params, {k: ctx.global_params[k] for k in BN_NAMES})
    assert np.allclose(result.state.layers["1.weight"].numpy(), expected["1.weight"].numpy(), atol=1e-5)


def test_the_server_averages_all_but_batchnorm_which_keeps_its_global_value():
    plugin = algo()
    start = P.model_params(bn_model())
    buffers = frozenset({"1.running_mean", "1.running_var"})
    state = plugin.init(P.clone(start), RunInfo(2, 2, 1, SPEC, 0, buffers))
    agg = plugin.aggregator()
    results = [plugin.client_update(context(x=X[:k], y=Y[:k])) for k in (2, 4)]
    acc = agg.zero()
    for i, result in enumerate(results):
        acc = agg.add(acc, i, result)
    new, _ = plugin.server_update(state, agg.result(acc), 0, INFO)
    mean = (2 * results[0].update["2.weight"] + 4 * results[1].update["2.weight"]) / 6
    assert torch.allclose(new.params["2.weight"], start["2.weight"] - mean, atol=1e-6)
    for name in BN_NAMES:
        assert torch.equal(new.params[name], start[name])


def test_the_personal_model_is_the_global_model_with_the_clients_batchnorm():
    plugin = algo()
    ctx = context(plugin.ClientState(own_batchnorm()))
    model = plugin.personal_model(ctx).eval()
    x = torch.tensor(X).float()
    bn = own_batchnorm()
    g = ctx.global_params
    h = x @ g["0.weight"].T + g["0.bias"]
    hn = bn["1.weight"] * (h - bn["1.running_mean"]) / torch.sqrt(bn["1.running_var"] + 1e-5) + bn["1.bias"]
    with torch.no_grad():
        assert torch.allclose(model(x), hn @ g["2.weight"].T + g["2.bias"], atol=1e-5)


def test_a_model_without_batchnorm_is_refused():
    with pytest.raises(ConfigError, match="fedbn keeps BatchNorm layers local, and the model has none"):
        algo().init({"w": torch.zeros(1)}, RunInfo(2, 2, 1, SPEC, 0))
