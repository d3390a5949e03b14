"""MOON's client against a hand-written torch reference.

Model: features z = tanh(x A^T + a) (D = 3), head logits = z B^T + b. On a batch of n examples the
local objective is
    CE(logits, y) + mu * (1/n) sum_n -log( e^{s_g/T} / (e^{s_g/T} + e^{s_p/T}) ),
    s_g = cos(z, z_glob),  s_p = cos(z, z_prev),
where z_glob and z_prev are the features under the global and the negative's weights (constants).
Two full-batch SGD steps from the global weights: w <- w - lr * grad. At the first step z = z_glob,
so only s_p pulls; the second step sees both. The reference writes the objective out with plain
tensors and lets autograd differentiate it; it never calls the plugin's code.
"""

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import SPEC
from torch import nn

from raysim import params as P
from raysim import registry
from raysim.errors import ConfigError
from raysim.types import ClientContext, ClientData, DataSpec, Payload, RunInfo

LR, MU, T, STEPS = 0.5, 2.0, 0.5, 2
X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -1.2], [2.0, 0.1]])
Y = np.array([0, 1, 1, 0])
GLOBAL = {
    "body.weight": np.array([[0.5, -0.25], [0.1, 0.3], [-0.4, 0.2]]),
    "body.bias": np.array([0.05, -0.05, 0.1]),
    "head.weight": np.array([[0.3, -0.2, 0.1], [-0.1, 0.4, 0.2]]),
    "head.bias": np.array([0.01, -0.02]),
}
PREVIOUS = {k: v + 0.3 * np.cos(np.arange(v.size)).reshape(v.shape) for k, v in GLOBAL.items()}

INFO = RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)  # the run's facts


class TinyFeatureModel(nn.Module):
    """A feature model as in raysim/models/anatomy.py: forward(x) == head(features(x))."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.body = nn.Linear(2, 3)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(3, 2)

    def features(self, x):
        return self.drop(torch.tanh(self.body(x)))

    def forward(self, x):
        return self.head(self.features(x))


def algo(**options):
    entry = registry.get("algorithm", "moon")
    config = {"mu": MU, "temperature": T, "local": {"lr": LR, "batch_size": len(X), "epochs": STEPS}}
    return entry.factory(entry.config.model_validate(config | options))


def moon_module():
    return sys.modules[registry.get("algorithm", "moon").factory.__module__]


def init_state(plugin):
    params = {k: torch.tensor(v, dtype=torch.float32) for k, v in GLOBAL.items()}
    return plugin.init(params, RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=SPEC, seed=0))


def context(payload, state=None, model=None, client_init=None):
    model = model or TinyFeatureModel()
    P.load_into(model, payload.params)  # as the worker does before client_update
    return ClientContext(
        client_id=0,
        round_num=0,
        model=model,
        payload=replace(payload, extra=P.to_device(payload.extra, "cpu")),
        global_params={k: torch.from_numpy(v) for k, v in payload.params.items()},
        data=ClientData({"x": X.astype(np.float32), "y": Y}),
        state=state,
        seed=0,
        device=torch.device("cpu"),
        spec=SPEC,
        client_init=client_init,
    )


def reference_delta(negative, mu=MU, temperature=T):
    """``global - local`` after STEPS full-batch steps on the written-out objective (float64)."""
    x, y = torch.tensor(X), torch.tensor(Y)
    const = {k: torch.tensor(v) for k, v in GLOBAL.items()}
    neg = {k: torch.tensor(v) for k, v in negative.items()}

    def features(w):
        return torch.tanh(x @ w["body.weight"].T + w["body.bias"])

    def cos(u, v):
        return (u * v).sum(1) / (u.norm(dim=1) * v.norm(dim=1))

    w = {k: v.clone().requires_grad_() for k, v in const.items()}
    for _ in range(STEPS):
        z = features(w)
        logits = z @ w["head.weight"].T + w["head.bias"]
        ce = -torch.log_softmax(logits, 1)[torch.arange(len(y)), y].mean()
        s_g, s_p = cos(z, features(const)) / temperature, cos(z, features(neg)) / temperature
        l_con = -torch.log(torch.exp(s_g) / (torch.exp(s_g) + torch.exp(s_p))).mean()
        grads = torch.autograd.grad(ce + mu * l_con, list(w.values()))
        w = {k: (v - LR * g).detach().requires_grad_() for (k, v), g in zip(w.items(), grads)}
    return {k: (const[k] - v).detach().numpy() for k, v in w.items()}


def assert_delta(update, expected):
    for k, v in expected.items():
        np.testing.assert_allclose(update[k].numpy(), v, atol=2e-6, err_msg=k)


def test_the_contrastive_loss_is_the_papers_formula():
    rng = np.random.default_rng(0)
    z, z_glob, z_prev = (rng.normal(size=(5, 4)) for _ in range(3))

    def cos(u, v):
        return (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))

    pos, neg = np.exp(cos(z, z_glob) / 0.7), np.exp(cos(z, z_prev) / 0.7)
    expected = np.mean(-np.log(pos / (pos + neg)))
    got = moon_module().model_contrastive_loss(*(torch.tensor(a) for a in (z, z_glob, z_prev)), 0.7)
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_first_round_the_negative_is_the_global_model():
    """Positive and negative coincide, so l_con is the constant log 2: plain cross-entropy steps."""
    plugin = algo()
    result = plugin.client_update(context(plugin.payload(init_state(plugin), 0, INFO)))
    assert_delta(result.update, reference_delta(GLOBAL))


def test_the_negative_is_the_previous_local_model_kept_in_the_client_state():
    plugin = algo()
    previous = plugin.ClientState({k: torch.tensor(v, dtype=torch.float32) for k, v in PREVIOUS.items()})
    ctx = context(plugin.payload(init_state(plugin), 0, INFO), state=previous)
    result = plugin.client_update(ctx)
    assert_delta(result.update, reference_delta(PREVIOUS))
    kept = result.state.previous  # this round's local model: next round's negative
    for k, v in GLOBAL.items():
        np.testing.assert_allclose(kept[k].numpy(), v - result.update[k].numpy(), atol=1e-6)


def test_train_loss_is_the_cross_entropy_alone():
    """One step: train/loss is the CE at the global weights, without the contrastive term."""
    plugin = algo(local={"lr": LR, "batch_size": len(X), "epochs": 1})
    result = plugin.client_update(context(plugin.payload(init_state(plugin), 0, INFO), state=None))
    z = np.tanh(X @ GLOBAL["body.weight"].T + GLOBAL["body.bias"])
    logits = z @ GLOBAL["head.weight"].T + GLOBAL["head.bias"]
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert result.metrics["train/loss"] == pytest.approx(-logp[np.arange(len(Y)), Y].mean(), rel=1e-5)


def test_the_authors_quirk_keeps_the_initial_model_as_the_negative():
    """negative: shared_init broadcasts the run's first global model; clients keep no state."""
    plugin = algo(negative="shared_init")
    state = init_state(plugin)
    later = replace(state, params={k: v + 0.3 * torch.ones_like(v) for k, v in state.params.items()})
    payload = plugin.payload(later, 5, INFO)
    np.testing.assert_allclose(payload.extra.initial["head.bias"], GLOBAL["head.bias"], atol=1e-7)
    previous = P.to_numpy({k: torch.tensor(v, dtype=torch.float32) for k, v in PREVIOUS.items()})
    extra = replace(payload.extra, initial=previous)
    swapped = replace(payload, params=P.to_numpy(state.params), extra=extra)
    result = plugin.client_update(context(swapped, state=plugin.ClientState("ignored")))
    assert_delta(result.update, reference_delta(PREVIOUS))
    assert result.state is None


def test_the_authors_code_contrasts_with_the_clients_own_random_initialisation():
    """negative: client_init (the FedGuCci code's prev_model: the client's own fresh model): the
    worker's ``client_init`` weights, asked anew each round; nothing is broadcast or kept."""
    plugin = algo(negative="client_init")
    payload = plugin.payload(init_state(plugin), 3, INFO)
    assert payload.extra is None
    own_init = {k: torch.tensor(v, dtype=torch.float32) for k, v in PREVIOUS.items()}
    result = plugin.client_update(context(payload, state=None, client_init=lambda: own_init))
    assert_delta(result.update, reference_delta(PREVIOUS))
    assert result.state is None
    with pytest.raises(RuntimeError, match="client_init"):
        plugin.client_update(context(payload))


class TinyBatchNormModel(TinyFeatureModel):
    """features(x) = tanh(BN(x A^T + a)): a BatchNorm whose running statistics show every
    forward pass made in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(3)

    def features(self, x):
        return torch.tanh(self.norm(self.body(x)))


def test_with_batchnorm_only_the_live_model_updates_the_running_statistics():
    """One full-batch step: the live model's forward in train mode moves the running statistics
    once, to (1 - 0.1) r + 0.1 batch statistic (unbiased variance) of h = x A^T + a at the
    global weights; the frozen global and negative passes (eval mode) must not move them again,
    nor touch the broadcast's statistics they run with."""
    torch.manual_seed(0)
    start = TinyBatchNormModel()
    with torch.no_grad():
        start.norm.running_mean.copy_(torch.tensor([0.5, -0.2, 0.1]))
        start.norm.running_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
    broadcast = P.to_numpy(P.clone(P.model_params(start)))
    negative = {k: torch.as_tensor(v) * 0.5 for k, v in broadcast.items()}
    plugin = algo(negative="client_init", local={"lr": LR, "batch_size": len(X), "epochs": 1})
    ctx = context(Payload(broadcast), model=TinyBatchNormModel(), client_init=lambda: negative)
    plugin.client_update(ctx)
    h = X @ broadcast["body.weight"].astype(np.float64).T + broadcast["body.bias"]
    expected_mean = 0.9 * np.array([0.5, -0.2, 0.1]) + 0.1 * h.mean(0)
    expected_var = 0.9 * np.array([2.0, 0.5, 1.5]) + 0.1 * h.var(0, ddof=1)
    np.testing.assert_allclose(ctx.model.norm.running_mean.numpy(), expected_mean, rtol=1e-5)
    np.testing.assert_allclose(ctx.model.norm.running_var.numpy(), expected_var, rtol=1e-5)
    assert int(ctx.model.norm.num_batches_tracked) == 1
    np.testing.assert_array_equal(
        ctx.global_params["norm.running_mean"].numpy(), broadcast["norm.running_mean"]
    )
    assert ctx.model.training


def test_frozen_features_run_in_eval_mode_and_leave_the_model_as_it_was():
    model = TinyFeatureModel(dropout=0.5).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    other = {k: torch.tensor(v, dtype=torch.float32) for k, v in PREVIOUS.items()}
    x = torch.tensor(X, dtype=torch.float32)
    z = moon_module().FrozenFeatures(model, other)(x)
    reference = TinyFeatureModel(dropout=0.5)
    reference.load_state_dict(other)
    torch.testing.assert_close(z, reference.eval().features(x))  # no dropout: eval mode
    assert model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_task_other_than_classification_is_refused():
    regression = DataSpec(task="regression", input_shape=(2,), num_classes=1)
    params = {k: torch.tensor(v) for k, v in GLOBAL.items()}
    with pytest.raises(ConfigError, match="classification"):
        algo().init(params, RunInfo(num_clients=4, cohort_size=2, num_rounds=1, spec=regression, seed=0))
