"""SAM and ASAM steps against a numpy reference of their two-pass update on a linear model.

The model is y_hat = x W^T + b with the mean squared error over the B x C outputs, whose
gradient is hand-derived: with r = x W^T + b - y,
    dL/dW = 2 r^T x / (B C),   dL/db = 2 sum_B r / (B C).
One SAM step at lr with plain SGD (Foret et al. 2021, eq. 2 and Algorithm 1):
    g = grad L(w);   e = rho g / ||g||;   w <- w - lr grad L(w + e)
where ||.|| is the L2 norm of (dW, db) as one vector. ASAM (Kwon et al. 2021) scales it by
T = |W| + eta for W and T = 1 for b:  e = rho T^2 g / ||T g||.
"""

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raysim import registry
from raysim.train.client_change import ClientChange
from raysim.train.local import LocalHooks, LocalTrainConfig, train_local
from raysim.train.sharpness import SamConfig, sam_descend, sam_step
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("regression", (3,), 2)
RHO, LR, ETA = 0.3, 0.1, 0.01


def regression_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 3))
    y = x @ np.array([[1.0, 0.5], [-1.0, 0.0], [0.2, 2.0]]) + 0.1
    return ClientData({"x": x.astype(np.float32), "y": y.astype(np.float32)})


def linear_model():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def grad(w, b, x, y):
    r = x @ w.T + b - y
    return 2 * r.T @ x / r.size, 2 * r.sum(0) / r.size


def reference_sam(w, b, x, y, steps, adaptive=False, shift=0.0):
    """``steps`` SAM (or ASAM) steps; ``shift`` is added to every gradient (the change's edit)."""
    for _ in range(steps):
        gw, gb = (g + shift for g in grad(w, b, x, y))
        tw, tb = (np.abs(w) + ETA, 1.0) if adaptive else (1.0, 1.0)
        norm = np.sqrt(((tw * gw) ** 2).sum() + ((tb * gb) ** 2).sum())
        ew, eb = RHO * tw**2 * gw / norm, RHO * tb**2 * gb / norm
        pw, pb = (g + shift for g in grad(w + ew, b + eb, x, y))
        w, b = w - LR * pw, b - LR * pb
    return w, b


@pytest.mark.parametrize(
    ("adaptive", "shift"), [(False, 0.0), (True, 0.0), (False, 0.2)], ids=["sam", "asam", "sam+hook"]
)
def test_sam_matches_the_two_pass_reference(adaptive, shift):
    """Two full-batch steps (two epochs): the second starts from the first's restored-then-stepped w."""
    model, data = linear_model(), regression_data()
    w0, b0 = model.weight.detach().double().numpy(), model.bias.detach().double().numpy()

    change = ClientChange(edit=lambda weights, grads, own: {k: g + shift for k, g in grads.items()})

    config = LocalTrainConfig(epochs=2, batch_size=6, lr=LR)
    step = sam_step(RHO, adaptive, eta=ETA)
    train_local(model, data, config, seed=0, spec=SPEC, hooks=LocalHooks(change=change, step=step))

    x, y = data.arrays["x"].astype(np.float64), data.arrays["y"].astype(np.float64)
    w, b = reference_sam(w0, b0, x, y, steps=2, adaptive=adaptive, shift=shift)
    assert np.allclose(model.weight.detach().numpy(), w, atol=1e-6)
    assert np.allclose(model.bias.detach().numpy(), b, atol=1e-6)
    plain_w = w0 - LR * (grad(w0, b0, x, y)[0] + shift)  # SAM must differ from a plain step
    assert not np.allclose(w, plain_w, atol=1e-3)


def test_sam_reports_the_loss_at_the_unperturbed_weights():
    model, data = linear_model(), regression_data()
    x, y = data.arrays["x"].astype(np.float64), data.arrays["y"].astype(np.float64)
    w0, b0 = model.weight.detach().double().numpy(), model.bias.detach().double().numpy()
    config = LocalTrainConfig(batch_size=6, lr=LR)
    metrics = train_local(model, data, config, seed=0, spec=SPEC, hooks=LocalHooks(step=sam_step(RHO)))
    assert metrics["train/loss"] == pytest.approx(np.mean((x @ w0.T + b0 - y) ** 2), rel=1e-5)
    assert metrics["train/steps"] == 1


def test_the_perturbed_pass_leaves_batchnorm_statistics_alone():
    """BatchNorm sees the batch once per step, at w: its statistics equal a plain step's."""
    data = regression_data()
    nets = []
    for step in (None, sam_step(RHO)):
        torch.manual_seed(0)
        net = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2))
        train_local(
            net, data, LocalTrainConfig(batch_size=6, lr=LR), seed=0, spec=SPEC, hooks=LocalHooks(step=step)
        )
        nets.append(net[0])
    plain, sam = nets
    assert int(sam.num_batches_tracked) == 1
    assert torch.equal(sam.running_mean, plain.running_mean)
    assert torch.equal(sam.running_var, plain.running_var)


def test_negative_rho_is_refused():
    with pytest.raises(ValueError, match="rho"):
        sam_step(-0.1)


def test_sam_runs_on_a_float64_model_as_on_float32():
    """The norm of float64 gradients is taken in float64 (a float32 reduction refused them)."""
    data = regression_data()
    single, double = linear_model(), linear_model().double()
    wide = ClientData({k: v.astype(np.float64) for k, v in data.arrays.items()})
    config = LocalTrainConfig(epochs=1, batch_size=6, lr=LR)
    train_local(single, data, config, seed=0, spec=SPEC, hooks=LocalHooks(step=sam_step(RHO)))
    train_local(double, wide, config, seed=0, spec=SPEC, hooks=LocalHooks(step=sam_step(RHO)))
    assert np.allclose(double.weight.detach().numpy(), single.weight.detach().numpy(), atol=1e-5)


def test_sam_descend_with_the_clean_gradient_added_steps_on_both():
    """One step of the FedGuCci code's quirk: w1 = w0 - lr (g(w0) + g(w0 + rho g(w0) / ||g(w0)||))."""
    model, data = linear_model(), regression_data()
    x, y = data.arrays["x"].astype(np.float64), data.arrays["y"].astype(np.float64)
    w0, b0 = model.weight.detach().double().numpy(), model.bias.detach().double().numpy()

    def step(model, batch, optimizer, backward):
        return sam_descend(model, batch, optimizer, backward, SamConfig(rho=RHO), add_clean_gradient=True)

    train_local(
        model, data, LocalTrainConfig(batch_size=6, lr=LR), seed=0, spec=SPEC, hooks=LocalHooks(step=step)
    )
    gw, gb = grad(w0, b0, x, y)
    norm = np.sqrt((gw**2).sum() + (gb**2).sum())
    pw, pb = grad(w0 + RHO * gw / norm, b0 + RHO * gb / norm, x, y)
    assert np.allclose(model.weight.detach().numpy(), w0 - LR * (gw + pw), atol=1e-6)
    assert np.allclose(model.bias.detach().numpy(), b0 - LR * (gb + pb), atol=1e-6)


def test_sam_descend_without_sam_is_one_plain_gradient_step():
    model, data = linear_model(), regression_data()
    x, y = data.arrays["x"].astype(np.float64), data.arrays["y"].astype(np.float64)
    w0, b0 = model.weight.detach().double().numpy(), model.bias.detach().double().numpy()

    def step(model, batch, optimizer, backward):
        return sam_descend(model, batch, optimizer, backward, None)

    train_local(
        model, data, LocalTrainConfig(batch_size=6, lr=LR), seed=0, spec=SPEC, hooks=LocalHooks(step=step)
    )
    gw, gb = grad(w0, b0, x, y)
    assert np.allclose(model.weight.detach().numpy(), w0 - LR * gw, atol=1e-6)
    assert np.allclose(model.bias.detach().numpy(), b0 - LR * gb, atol=1e-6)


def test_sam_config_refuses_an_eta_that_sam_would_ignore():
    assert SamConfig(rho=0.3, adaptive=True, eta=0.2).eta == 0.2
    assert SamConfig(rho=0.3).eta == 0.01  # the default, unused by SAM, is accepted
    with pytest.raises(ValidationError, match="set adaptive: true, or drop eta"):
        SamConfig(rho=0.3, eta=0.2)
    with pytest.raises(ValueError, match="drop eta"):
        sam_step(0.3, eta=0.2)


def test_a_partial_sam_setting_keeps_the_plugins_other_defaults():
    """Jobs validate options with registry.plugin_config: fedasam's ``sam: {rho: 0.2, eta: 0.05}``
    (the IMA code's ResNet setting) stays ASAM; FedGuCci+'s ``sam: {rho: 0.3}`` stays SAM."""
    asam = registry.plugin_config(
        registry.get("algorithm", "fedasam").config, {"sam": {"rho": 0.2, "eta": 0.05}}
    )
    assert asam.sam == SamConfig(rho=0.2, adaptive=True, eta=0.05)
    plus = registry.plugin_config(registry.get("algorithm", "fedgucci_plus").config, {"sam": {"rho": 0.3}})
    assert plus.sam == SamConfig(rho=0.3)
