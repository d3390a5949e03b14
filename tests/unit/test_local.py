"""The shared local trainer: capped subsets, lr schedule, hooks, evaluation."""

import numpy as np
import pytest
import torch
from torch import nn

from raysim.local import (
    LocalTrainConfig,
    cap_examples,
    evaluate,
    iterate_batches,
    round_lr,
    task_loss,
    train_local,
)
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("classification", (3,), 2)


def data(n=12):
    rng = np.random.default_rng(0)
    return ClientData(
        {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": (np.arange(n) % 2).astype(np.int64)}
    )


def model():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def test_cap_is_one_seeded_subset_of_distinct_rows():
    full = data(12)
    a, b = cap_examples(full, 5, seed=9), cap_examples(full, 5, seed=9)
    assert len(a) == 5 and np.array_equal(a.arrays["x"], b.arrays["x"])
    rows = {tuple(r) for r in a.arrays["x"].tolist()}
    assert len(rows) == 5 and rows <= {tuple(r) for r in full.arrays["x"].tolist()}
    assert not np.array_equal(a.arrays["x"], cap_examples(full, 5, seed=10).arrays["x"])
    assert cap_examples(full, 50, seed=9) is full


def test_lr_decays_per_round():
    config = LocalTrainConfig(lr=0.1, lr_decay=0.5, batch_size=12)
    assert round_lr(config, 2) == pytest.approx(0.025)
    decayed, plain = model(), model()
    train_local(decayed, data(), config, seed=0, spec=SPEC, round_num=2)
    train_local(plain, data(), LocalTrainConfig(lr=0.025, batch_size=12), seed=0, spec=SPEC)
    assert torch.allclose(decayed.weight, plain.weight)


def test_loss_fn_replaces_the_task_loss():
    zero = lambda m, batch, spec: ((m(batch["x"]) * 0).sum(), 0, len(batch["y"]))  # noqa: E731
    net = model()
    before = net.weight.detach().clone()
    metrics = train_local(net, data(), LocalTrainConfig(), seed=0, spec=SPEC, loss_fn=zero)
    assert torch.equal(net.weight, before) and metrics["train/loss"] == 0.0


def test_max_steps_and_batches():
    metrics = train_local(
        model(), data(12), LocalTrainConfig(batch_size=5, epochs=3, max_steps=4), seed=0, spec=SPEC
    )
    assert metrics["train/steps"] == 4
    sizes = [len(b["y"]) for b in iterate_batches({"y": torch.arange(12)}, 5)]
    assert sizes == [5, 5, 2]


def test_evaluate_matches_a_direct_computation():
    net, d = model(), data()
    metrics = evaluate(net, d, SPEC, batch_size=5)
    logits = net(torch.from_numpy(d.arrays["x"])).detach()
    y = torch.from_numpy(d.arrays["y"])
    assert metrics["loss"] == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert metrics["num_examples"] == 12


def test_causal_lm_loss_ignores_padding_and_shifts():
    spec = DataSpec("causal_lm", (4,), 5, pad_token_id=0)

    class Echo(nn.Module):  # predicts "next token = current token + 1" with certainty
        def forward(self, x):
            return torch.nn.functional.one_hot((x + 1) % 5, 5).float() * 50

    batch = {"x": torch.tensor([[1, 2, 3, 0], [2, 3, 4, 4]])}
    loss, correct, count = task_loss(Echo(), batch, spec)
    # targets: [2, 3, 0(pad)] and [3, 4, 4]: 5 real targets, the echo gets 2,3 and 3,4 right (4)
    assert count == 5 and correct == 4
