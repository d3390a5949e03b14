"""Vectorized training equals ``train_local`` run client by client, and a client that has run out
of batches does not move (checked against a numpy SGD step, independently of ``train_local``)."""

import numpy as np
import pytest
import torch
from torch import nn

import raysim.train.vectorized as vectorized_module
from raysim import params as P
from raysim.train.local import LocalTrainConfig, train_local
from raysim.train.vectorizable import vectorization_blocker
from raysim.train.vectorized import train_local_vectorized
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("classification", (1, 6, 6), 3)
SIZES = (7, 12, 3, 0, 10)  # a short last batch, a client without data, unequal batch counts
SEEDS = (11, 12, 13, 14, 15)
BUDGETS = (None, 2, None, None, None)  # a straggler's step budget


def norm_model() -> nn.Module:
    """BatchNorm (per-client running statistics) and GroupNorm, seeded."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(16, 3),
    )  # fmt: skip


def client_data() -> list[ClientData]:
    rng = np.random.default_rng(0)
    return [
        ClientData({"x": rng.normal(size=(n, 1, 6, 6)).astype(np.float32), "y": rng.integers(0, 3, n)})
        for n in SIZES
    ]


CONFIGS = {
    "sgd": LocalTrainConfig(lr=0.1, batch_size=4),
    "momentum_weight_decay_epochs": LocalTrainConfig(
        lr=0.1, batch_size=4, momentum=0.9, weight_decay=1e-3, epochs=2
    ),
    "adam_clipped": LocalTrainConfig(
        lr=0.01, batch_size=4, optimizer="adam", epochs=2, weight_decay=1e-2, grad_clip=0.5
    ),
    "max_steps_across_epochs": LocalTrainConfig(lr=0.1, batch_size=3, max_steps=5, epochs=3),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_equals_training_each_client_in_turn(name):
    config, datas = CONFIGS[name], client_data()
    stacked, metrics, _ = train_local_vectorized(
        norm_model(), datas, config, seeds=SEEDS, spec=SPEC, step_budgets=BUDGETS
    )
    for i, data in enumerate(datas):
        alone = norm_model()
        expected = train_local(alone, data, config, seed=SEEDS[i], spec=SPEC, step_budget=BUDGETS[i])
        for key, value in P.model_params(alone).items():  # parameters and BatchNorm statistics
            torch.testing.assert_close(stacked[key][i], value, rtol=1e-5, atol=1e-6, msg=f"client {i} {key}")
        assert metrics[i] == pytest.approx(expected, rel=1e-5)


def test_a_client_without_batches_left_stays_where_its_last_step_left_it():
    """Client 0 has one batch, client 1 four; with momentum 0.9, a client that kept stepping on
    its momentum after its batches ran out would move on. Expected: one numpy SGD step."""
    w0, b0 = np.array([[0.5, -0.25], [0.1, 0.3]]), np.array([0.05, -0.05])
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(w0))
        model.bias.copy_(torch.tensor(b0))
    rng = np.random.default_rng(1)
    x0, y0 = np.array([[1.0, -2.0], [0.5, 1.5]]), np.array([1, 0])
    datas = [
        ClientData({"x": x0.astype(np.float32), "y": y0}),
        ClientData({"x": rng.normal(size=(8, 2)).astype(np.float32), "y": rng.integers(0, 2, 8)}),
    ]
    lr = 0.3
    config = LocalTrainConfig(lr=lr, batch_size=2, momentum=0.9)
    spec = DataSpec("classification", (2,), 2)
    stacked, metrics, _ = train_local_vectorized(model, datas, config, seeds=(0, 1), spec=spec)
    z = x0 @ w0.T + b0
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = p - np.eye(2)[y0]  # softmax cross-entropy's gradient: (p - onehot)^T x / n
    np.testing.assert_allclose(stacked["weight"][0].numpy(), w0 - lr * err.T @ x0 / 2, atol=1e-6)
    np.testing.assert_allclose(stacked["bias"][0].numpy(), b0 - lr * err.mean(0), atol=1e-6)
    assert (metrics[0]["train/steps"], metrics[1]["train/steps"]) == (1.0, 4.0)


def test_the_starting_model_is_left_as_it_was():
    model = norm_model()
    before = P.clone(P.model_params(model))
    train_local_vectorized(model, client_data(), CONFIGS["sgd"], seeds=SEEDS, spec=SPEC)
    for key, value in P.model_params(model).items():
        assert torch.equal(value, before[key]), key


def test_randomness_other_than_dropout_is_refused_naming_the_module():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Dropout2d(0.5), nn.Flatten(), nn.Linear(64, 3))
    assert vectorization_blocker(model) == "module '1' (Dropout2d) draws random masks per client"
    with pytest.raises(ValueError, match="module '1'"):
        train_local_vectorized(model, [], CONFIGS["sgd"], seeds=[], spec=SPEC)
    assert vectorization_blocker(nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.5))) is None


class FunctionalDropout(nn.Module):
    """Dropout inside a forward, as HuggingFace attention's ``dropout_p``: no module type shows it."""

    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.1, self.training)


def test_randomness_inside_a_forward_is_found_by_running_it():
    model = nn.Sequential(nn.Linear(2, 4), FunctionalDropout(), nn.Linear(4, 2))
    example = torch.ones(2, 2)
    assert vectorization_blocker(model) is None  # the module types alone do not show it
    assert "draws random numbers other than nn.Dropout's" in vectorization_blocker(model, example)
    assert vectorization_blocker(norm_model(), torch.ones(2, 1, 6, 6)) is None  # BatchNorm, GroupNorm
    hashed = nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    assert vectorization_blocker(hashed, example) is None
    assert model.training and "forward" not in vars(hashed[1])  # the mode and dropout as they were


class DataBranch(nn.Module):
    """A branch on the data's values: ``vmap`` cannot batch it."""

    def forward(self, x):
        return x if x.sum() > 0 else -x


class SignedBackward(torch.autograd.Function):
    """The identity, whose backward branches on the gradient's values: only the backward fails."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g if float(g.sum()) > 0 else -g


class BackwardBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(36, 3)

    def forward(self, x):
        return SignedBackward.apply(self.head(x.flatten(1)))


class UnusedHead(nn.Module):
    """A second head the forward never uses: ``torch.optim`` skips it (no gradient)."""

    def __init__(self):
        super().__init__()
        self.head, self.spare = nn.Linear(36, 3), nn.Linear(36, 3)

    def forward(self, x):
        return self.head(x.flatten(1))


@pytest.mark.parametrize(
    "model, reason",
    [
        (nn.Sequential(nn.Flatten(), nn.Linear(36, 5), nn.BatchNorm1d(5, momentum=None), nn.Linear(5, 3)),
         "does not run under vmap"),  # a cumulative average reads num_batches_tracked as a number
        (nn.Sequential(nn.Flatten(), DataBranch(), nn.Linear(36, 3)), "does not run under vmap"),
        (BackwardBranch(), "does not run under vmap"),  # its forward alone does
        (UnusedHead(), "never uses the trainable parameters spare.weight, spare.bias"),
    ],
)  # fmt: skip
def test_what_vmap_cannot_train_as_train_local_does_is_refused_with_the_reason(model, reason):
    before = P.clone(P.model_params(model))
    assert reason in vectorization_blocker(model, torch.ones(2, 1, 6, 6))
    with pytest.raises(ValueError, match=reason):
        train_local_vectorized(model, client_data(), CONFIGS["sgd"], seeds=SEEDS, spec=SPEC)
    assert all(torch.equal(v, before[k]) for k, v in P.model_params(model).items())  # the probe wrote nothing


def test_a_batch_transform_is_refused():
    datas = client_data()
    datas[1] = ClientData(datas[1].arrays, batch_transform=lambda batch, step: batch)
    with pytest.raises(ValueError, match="batch_transform"):
        train_local_vectorized(norm_model(), datas, CONFIGS["sgd"], seeds=SEEDS, spec=SPEC)


def test_a_model_is_checked_once_per_set_of_trainable_parameters(monkeypatch):
    """A worker trains one resident model chunk after chunk: the check runs again only when
    which parameters train changes (the unused-parameter part depends on it)."""
    checked = []

    def counting(model, example=None):
        checked.append(tuple(p.requires_grad for p in model.parameters()))
        return vectorization_blocker(model, example)

    monkeypatch.setattr(vectorized_module, "vectorization_blocker", counting)
    model, config = norm_model(), CONFIGS["sgd"]
    for _ in range(2):
        train_local_vectorized(model, client_data(), config, seeds=SEEDS, spec=SPEC)
    assert len(checked) == 1
    model[0].bias.requires_grad_(False)
    train_local_vectorized(model, client_data(), config, seeds=SEEDS, spec=SPEC)
    assert len(checked) == 2 and checked[1] != checked[0]
