"""FedLC's calibrated cross-entropy (raysim/train/losses.py) and the fedlc plugin, against hand values
and a numpy reference (Zhang et al., ICML 2022, arXiv:2209.00189; Li et al., KDD 2025, arXiv:2402.18949).

z'_c = z_c - tau n_c^(-1/4), loss = CE(softmax(z'), y). Hand values for tau = 0.1 and counts
(16, 1, 0): shifts 0.1 / 2 = 0.05 and 0.1, and -inf for the unseen class. Equal counts shift every
logit alike, which softmax ignores, so the loss and its gradient are plain CE's. For the linear
model z = x W^T + b, grad_W = (softmax(z') - onehot)^T x / B and grad_b = mean(softmax(z') - onehot).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import B0, SPEC, W0, context, payload
from torch import nn

from raysim import registry
from raysim.errors import ConfigError
from raysim.train.losses import calibrate_logits, fedlc_loss, label_counts, logit_calibrated_loss
from raysim.types import DataSpec, RunInfo

SPEC3 = DataSpec(task="classification", input_shape=(2,), num_classes=3)


def fixed_logits(logits):
    """A model that outputs ``logits`` (one row per example) whatever its input."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    model = nn.Linear(2, logits.shape[1]).double()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(logits[0])
    return model


def test_hand_values_and_unseen_classes():
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    out = calibrate_logits(z, torch.tensor([16.0, 1.0, 0.0]), strength=0.1)
    assert torch.allclose(out[0, :2], torch.tensor([0.95, 1.9], dtype=torch.float64))
    assert out[0, 2] == -torch.inf
    assert torch.softmax(out, -1)[0, 2] == 0.0


def test_equal_counts_give_plain_cross_entropy_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 2, 1, 1, 0])
    calibrated = F.cross_entropy(calibrate_logits(logits, torch.full((3,), 7.0), strength=0.5), y)
    (g_cal,) = torch.autograd.grad(calibrated, logits)
    plain = F.cross_entropy(logits, y)
    (g_plain,) = torch.autograd.grad(plain, logits)
    assert torch.allclose(calibrated, plain, atol=1e-12) and torch.allclose(g_cal, g_plain, atol=1e-12)


def test_an_unseen_class_drops_out_with_a_finite_loss_and_gradient():
    logits = torch.tensor([[0.5, 3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    counts = torch.tensor([4.0, 0.0, 2.0])
    loss = F.cross_entropy(calibrate_logits(logits, counts, strength=0.1), torch.tensor([0]))
    (g,) = torch.autograd.grad(loss, logits)
    shifted = np.array([0.5 - 0.1 * 4**-0.25, -1.0 - 0.1 * 2**-0.25])  # the two seen classes
    expected = -shifted[0] + np.log(np.exp(shifted).sum())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    assert torch.isfinite(g).all() and g[0, 1] == 0.0


def test_accuracy_counts_the_raw_logits():
    """Raw argmax is class 0; the calibration (rare class 0 loses more) would flip it to 1."""
    model = fixed_logits([[1.03, 1.0]])
    loss_fn = logit_calibrated_loss(torch.tensor([1.0, 16.0]), strength=0.1)
    batch = {"x": torch.zeros(1, 2, dtype=torch.float64), "y": torch.tensor([0])}
    loss, correct, count = loss_fn(model, batch, SPEC)
    assert int(correct) == 1 and count == 1
    z = np.array([1.03 - 0.1, 1.0 - 0.05])
    assert float(loss.detach()) == pytest.approx(-z[0] + np.log(np.exp(z).sum()), rel=1e-9)


def test_label_counts():
    assert label_counts(np.array([2, 0, 2, 2]), 4).tolist() == [1.0, 0.0, 3.0, 0.0]
    with pytest.raises(ValueError, match="num_classes"):
        label_counts(np.array([0, 4]), 4)


def test_a_regression_task_is_refused():
    spec = DataSpec(task="regression", input_shape=(2,), num_classes=1)
    ctx = replace(context(np.zeros((2, 2)), np.zeros(2), payload()), spec=spec)
    with pytest.raises(ValueError, match="classification"):
        fedlc_loss(ctx, 0.1)
    run = RunInfo(num_clients=2, cohort_size=1, num_rounds=1, spec=spec, seed=0)
    with pytest.raises(ConfigError, match="fedlc"):
        fedlc(0.1).init({"weight": torch.zeros(1, 2)}, run)


# ---- the plugin ------------------------------------------------------------------------------

X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -1.2], [2.0, 0.1]])
Y = np.array([0, 1, 0, 0])
LR = 0.3


def fedlc(tau, **local):
    entry = registry.get("algorithm", "fedlc")
    return entry.factory(
        entry.config.model_validate(
            {"logit_calibration": {"strength": tau}, "local": {"lr": LR, "batch_size": 4} | local}
        )
    )


def calibrated_grad(w, b, x, y, counts, tau):
    z = x @ w.T + b - np.where(counts > 0, tau * np.maximum(counts, 1) ** -0.25, np.inf)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = p - np.eye(w.shape[0])[y]
    return err.T @ x / len(x), err.mean(0)


def test_one_step_matches_the_reference_with_the_clients_own_counts():
    result = fedlc(0.5).client_update(context(X, Y, payload()))
    gw, gb = calibrated_grad(W0, B0, X, Y, np.array([3.0, 1.0]), 0.5)
    assert np.allclose(result.update["weight"].numpy(), LR * gw, atol=1e-6)
    assert np.allclose(result.update["bias"].numpy(), LR * gb, atol=1e-6)
    plain = fedlc(0.0).client_update(context(X, Y, payload()))
    assert not np.allclose(plain.update["weight"].numpy(), LR * gw, atol=1e-4)


def test_a_client_that_saw_one_class_only_learns_nothing_finite():
    """Class 1 is -inf: softmax puts all mass on class 0, the only label, so the loss is 0."""
    result = fedlc(0.1).client_update(context(X, np.zeros(4, np.int64), payload()))
    assert all(float(v.abs().max()) == 0.0 for v in result.update.values())
    assert result.metrics["train/loss"] == 0.0


def test_tau_zero_is_fedavg():
    entry = registry.get("algorithm", "fedavg")
    fedavg = entry.factory(entry.config.model_validate({"local": {"lr": LR, "batch_size": 2, "epochs": 2}}))
    expected = fedavg.client_update(context(X, Y, payload())).update
    got = fedlc(0.0, batch_size=2, epochs=2).client_update(context(X, Y, payload())).update
    assert all(torch.allclose(got[k], expected[k], atol=1e-7) for k in expected)
