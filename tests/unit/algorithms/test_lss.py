"""LSS against an independent autograd reference on the linear softmax model of reference.py.

The reference works on the flat float64 vector theta = (W row by row, b) and writes each term out
(k frozen members, the round's start model f_p = (W0, B0)):
    task:      over the mixes a of CE(x; a_last theta + sum_j a_j frozen_j): their mean (paper, and
               lss_code's first ingredient, which mixes nothing) or, as the released code writes
               its later ingredients' loss, their sum divided by its accumulation step 15
    paper:     + lambda_a ||theta - f_p|| - lambda_d (sum_j ||theta - frozen_j||) / (k + 1)
    lss_code:  + lambda_a ||theta - f_p||^2 - lambda_d V^2, where V^2 is ||theta - frozen_0||^2 for
               a segment and, for a triangle, Heron's squared area over the squared edges p, q, r:
               16 A^2 = 2 (pq + qr + rp) - p^2 - q^2 - r^2
Autograd on theta gives the gradient (the norm's at 0 is 0). The coefficients come from
``mix_coefficients``, tested apart (on the simplex, uniform there, a pure function of its inputs).
"""

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import B0, SPEC, W0, context, grad, linear_model, payload, plugin_types

from raysim import params as P
from raysim import registry
from raysim.config.plugins import validate_plugin

X = np.array([[1.0, -2.0], [0.5, 1.5], [-1.0, 0.3], [2.0, 0.1]])
Y = np.array([1, 0, 1, 0])
THETA0 = np.concatenate([W0.ravel(), B0]).astype(np.float32).astype(np.float64)  # as the model holds it
LAMBDA_A, LAMBDA_D, LR = 0.3, 0.2, 0.1


def make(**options):
    entry = registry.get("algorithm", "lss")
    return entry.factory(entry.config.model_validate(options))


def as_params(theta):
    return {"weight": torch.tensor(theta[:4].reshape(2, 2)).float(), "bias": torch.tensor(theta[4:]).float()}


def task(theta, x, y):
    logits = torch.as_tensor(x) @ theta[:4].reshape(2, 2).T + theta[4:]
    return F.cross_entropy(logits, torch.as_tensor(y))


def reference_objective(theta, frozen, alphas, reading, weights=(LAMBDA_A, LAMBDA_D)):
    """The live ingredient's objective at ``theta`` (a float64 tensor)."""
    lambda_a, lambda_d = weights
    f_p, members = torch.as_tensor(THETA0), [torch.as_tensor(m) for m in frozen]
    mixes = [a[-1] * theta + sum(a_j * m for a_j, m in zip(a[:-1], members)) for a in alphas.tolist()]
    ces = [task(w, X, Y) for w in mixes]
    if reading == "paper" or not members:  # the code's phase 1 (one model, nothing mixed): plain CE
        loss = torch.stack(ces).mean()
    else:
        loss = sum(ces) / 15  # its phase 2: `ce / 15`, ce the sum of the mixes' CE
    if reading == "paper":
        affinity = torch.linalg.vector_norm(theta - f_p)
        diversity = sum(torch.linalg.vector_norm(theta - m) for m in members) / (len(members) + 1)
    else:
        affinity = ((theta - f_p) ** 2).sum()
        if not members:
            diversity = torch.zeros(())
        elif len(members) == 1:
            diversity = ((theta - members[0]) ** 2).sum()
        else:  # Heron
            p = ((members[0] - members[1]) ** 2).sum()
            q, r = ((theta - members[0]) ** 2).sum(), ((theta - members[1]) ** 2).sum()
            diversity = (2 * (p * q + q * r + r * p) - p**2 - q**2 - r**2) / 16
    return loss + lambda_a * affinity - lambda_d * diversity


def reference_step(theta, frozen, alphas, reading, weights=(LAMBDA_A, LAMBDA_D)):
    """(loss, gradient, theta after one SGD step at LR) of the reference objective."""
    live = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    loss = reference_objective(live, frozen, alphas, reading, weights)
    (grad,) = torch.autograd.grad(loss, live)
    return loss.item(), grad.numpy(), theta - LR * grad.numpy()


@pytest.mark.parametrize("reading", ["paper", "lss_code"])
@pytest.mark.parametrize("num_frozen", [1, 2])
def test_one_step_loss_and_gradient_match_the_reference(reading, num_frozen):
    """The plugin's mixed loss plus its regulariser at a live ingredient beside k frozen members."""
    plugin = make(reading=reading, affinity=LAMBDA_A, diversity=LAMBDA_D)
    lss = plugin_types(plugin)
    rng = np.random.default_rng(1)
    frozen = [THETA0 + rng.normal(0, 0.3, 6).astype(np.float32) for _ in range(num_frozen)]
    theta = THETA0 + rng.normal(0, 0.3, 6).astype(np.float32)
    model = linear_model()
    with torch.no_grad():
        for name, value in as_params(theta).items():
            getattr(model, name).copy_(value)
    alphas = lss.mix_coefficients(7, 1, 3, num_frozen + 1, plugin.config.num_mixes)
    assert alphas.shape == (plugin.config.num_mixes, num_frozen + 1)  # paper 1 mix, code 2
    batch = {"x": torch.tensor(X).float(), "y": torch.tensor(Y)}
    pool = [as_params(m) for m in frozen]
    regularizer = lss.regularizer(plugin.config, as_params(THETA0), pool)
    mixed = lss.mixed_loss(pool, alphas, scale=plugin.config.task_scale)
    loss = mixed(model, batch, SPEC)[0] + regularizer(model, batch)
    loss.backward()
    ref_loss, ref_grad, _ = reference_step(theta, frozen, alphas, reading)
    grad = np.concatenate([model.weight.grad.numpy().ravel(), model.bias.grad.numpy()])
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert np.allclose(grad, ref_grad, atol=1e-5)


@pytest.mark.parametrize(
    ("reading", "start_in_pool"), [("paper", False), ("lss_code", False), ("paper", True)]
)
def test_two_ingredients_of_two_steps_each_upload_the_mean_of_the_reference_pool(reading, start_in_pool):
    """N = 2, SGD, two epochs of one full batch: ingredient 1 takes two steps from f_p, ingredient 2
    two from the pool mean; the client uploads delta = f_p - mean(pool), with f_p in the pool when
    ``start_in_pool``."""
    plugin = make(
        num_models=2,
        reading=reading,
        start_in_pool=start_in_pool,
        later_epochs=2,  # lss_code's own: 2 // 8 -> 1
        affinity=LAMBDA_A,
        diversity=LAMBDA_D,
        local={"lr": LR, "batch_size": len(X), "epochs": 2},
    )
    lss = plugin_types(plugin)
    pool = [THETA0] if start_in_pool else []
    for i in range(2):
        theta = np.mean(pool, axis=0) if pool else THETA0
        for batch_num in range(2):  # a fresh mix per batch
            alphas = lss.mix_coefficients(0, i, batch_num, len(pool) + 1, plugin.config.num_mixes)
            theta = reference_step(theta, pool, alphas if pool else np.ones((1, 1)), reading)[2]
        pool.append(theta)
    result = plugin.client_update(context(X, Y, payload()))
    delta = np.concatenate([result.update["weight"].numpy().ravel(), result.update["bias"].numpy()])
    assert np.allclose(delta, THETA0 - np.mean(pool, axis=0), atol=1e-6)
    assert not np.allclose(delta, THETA0 - pool[-1], atol=1e-4)  # the mean, not the last ingredient
    assert result.weight == len(X) and result.metrics["lss/ingredients"] == 2


def test_lss_code_weighs_its_summed_mixes_by_one_fifteenth_against_full_weight_regularisers():
    """The released code's phase-2 loss (the authors' code), by hand at a live ingredient theta = 0 beside one
    frozen member at 0: every mix of the pool is 0, so each of the two mixes' CE is ln 2, the
    segment's squared volume ||theta - frozen||^2 is 0 and the affinity is ||f_p||^2:
        loss = (ln 2 + ln 2) / 15 + lambda_a ||f_p||^2.
    Its gradient: each mix's CE moves theta by its alpha_live times the CE gradient at 0,
    g0 = ((p - onehot)^T X / n, mean(p - onehot)) with p = (1/2, 1/2), the affinity's by
    2 lambda_a (theta - f_p):
        grad = (alpha_1,live + alpha_2,live) / 15 * g0 - 2 lambda_a f_p."""
    plugin = make(reading="lss_code", affinity=LAMBDA_A, diversity=LAMBDA_D)
    lss = plugin_types(plugin)
    zero = np.zeros(6)
    model = linear_model()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    alphas = lss.mix_coefficients(3, 1, 0, 2, plugin.config.num_mixes)
    pool = [as_params(zero)]
    mixed = lss.mixed_loss(pool, alphas, scale=plugin.config.task_scale)
    batch = {"x": torch.tensor(X).float(), "y": torch.tensor(Y)}
    loss = mixed(model, batch, SPEC)[0] + lss.regularizer(plugin.config, as_params(THETA0), pool)(
        model, batch
    )
    loss.backward()
    assert loss.item() == pytest.approx(2 * np.log(2) / 15 + LAMBDA_A * (THETA0**2).sum(), rel=1e-6)
    gw, gb = grad(np.zeros((2, 2)), np.zeros(2), X, Y)
    by_hand = alphas[:, -1].sum() / 15 * np.concatenate([gw.ravel(), gb]) - 2 * LAMBDA_A * THETA0
    got = np.concatenate([model.weight.grad.numpy().ravel(), model.bias.grad.numpy()])
    assert np.allclose(got, by_hand, atol=1e-6)
    assert plugin.config.task_scale == pytest.approx(1 / 15) and make().config.task_scale is None


def test_the_mix_loss_scale_reaches_training_and_the_metrics_keep_the_mixes_mean():
    """One step of ingredient 2 (beside ingredient 1, frozen after one step) under lss_code is the
    reference's step of the code's formula; ``train/loss`` still reports the mixes' mean CE, and a
    ``mix_loss_scale`` of 1/2 (the mean of two mixes) is the reading lss_code had before."""
    local = {"lr": LR, "batch_size": len(X), "epochs": 1}
    options = {
        "num_models": 2,
        "later_epochs": 1,
        "affinity": LAMBDA_A,
        "diversity": LAMBDA_D,
        "local": local,
    }
    plugin = make(reading="lss_code", **options)
    lss = plugin_types(plugin)
    first = reference_step(THETA0, [], np.ones((1, 1)), "lss_code")[2]
    alphas = lss.mix_coefficients(0, 1, 0, 2, 2)
    second = reference_step(first, [first], alphas, "lss_code")[2]
    result = plugin.client_update(context(X, Y, payload()))
    delta = np.concatenate([result.update["weight"].numpy().ravel(), result.update["bias"].numpy()])
    assert np.allclose(delta, THETA0 - (first + second) / 2, atol=1e-6)
    mixes = [a[-1] * torch.tensor(first) + a[0] * torch.tensor(first) for a in alphas]
    mean_ce = float(torch.stack([task(w, X, Y) for w in mixes]).mean())
    ce_first = float(task(torch.tensor(THETA0), X, Y))
    assert result.metrics["train/loss"] == pytest.approx((ce_first + mean_ce) / 2, rel=1e-5)
    halved = make(reading="lss_code", mix_loss_scale=0.5, **options).client_update(context(X, Y, payload()))
    assert not torch.allclose(halved.update["weight"], result.update["weight"], atol=1e-6)


def test_one_model_without_affinity_is_fedavg_bit_for_bit():
    """N = 1: nothing to mix with and no diversity; with lambda_a = 0 it is FedAvg's local run."""
    local = {"optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4, "batch_size": 2, "epochs": 3}

    def update(name, **options):
        entry = registry.get("algorithm", name)
        plugin = entry.factory(entry.config.model_validate({"local": local, **options}))
        return plugin.client_update(context(X, Y, payload())).update

    fedavg, lss = update("fedavg"), update("lss", num_models=1, affinity=0.0)
    assert all(torch.equal(fedavg[k], lss[k]) for k in fedavg)
    with_affinity = update("lss", num_models=1, affinity=1.0)
    assert not torch.equal(fedavg["weight"], with_affinity["weight"])


@pytest.mark.parametrize(
    ("options", "steps"),
    [({}, 8 + 8 + 8), ({"reading": "lss_code"}, 8 + 1 + 1), ({"later_epochs": 2}, 8 + 2 + 2)],
)
def test_each_reading_has_its_epoch_schedule(options, steps):
    """The paper trains every ingredient ``local.epochs`` epochs; the code the first only, the
    later ones epochs // 8 (one full batch per epoch here)."""
    plugin = make(num_models=3, local={"lr": 0.01, "batch_size": len(X), "epochs": 8}, **options)
    assert plugin.client_update(context(X, Y, payload())).metrics["train/steps"] == steps


def test_a_straggler_budget_caps_all_ingredients_together():
    plugin = make(num_models=3, local={"lr": 0.01, "batch_size": len(X), "epochs": 2})
    ctx = replace(context(X, Y, payload()), step_budget=3)
    metrics = plugin.client_update(ctx).metrics
    assert metrics["train/steps"] == 3 and metrics["lss/ingredients"] == 2


def test_mix_coefficients_are_uniform_on_the_simplex_and_a_pure_function():
    lss = plugin_types(make())
    draws = np.concatenate([lss.mix_coefficients(5, 0, b, 3, 1) for b in range(4000)])
    assert np.allclose(draws.sum(1), 1.0) and (draws >= 0).all()
    # Dirichlet(1, 1, 1): each coordinate is Beta(1, 2), mean 1/3 and P(> 1/2) = 1/4
    assert np.allclose(draws.mean(0), 1 / 3, atol=0.02)
    assert np.allclose((draws > 0.5).mean(0), 0.25, atol=0.03)
    assert np.array_equal(lss.mix_coefficients(5, 2, 9, 3, 2), lss.mix_coefficients(5, 2, 9, 3, 2))
    assert not np.array_equal(lss.mix_coefficients(5, 2, 9, 3, 2), lss.mix_coefficients(5, 1, 9, 3, 2))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_models": 0}, "algorithm.num_models: num_models is N, .* at least 1 .* got 0"),
        ({"affinity": -1.0}, "algorithm.affinity: "),
        ({"diversity": -0.5}, "algorithm.diversity: "),
        ({"later_epochs": 0}, "algorithm.later_epochs: "),
        ({"mixes_per_batch": 0}, "algorithm.mixes_per_batch: "),
        ({"reading": "code"}, "algorithm.reading: .*lss_code"),
    ],
)
def test_impossible_configs_are_refused_naming_the_key(options, message):
    problems: list[str] = []
    assert validate_plugin("algorithm", {"name": "lss", **options}, problems) is None
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def test_batchnorm_statistics_follow_every_mixed_pass_and_travel():
    """As the authors' code: one set of running statistics, the live model's, updated by the mixed passes of
    every ingredient and sent with the soup; so N = 2 ends with other statistics than N = 1."""

    def update(num_models):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
        ctx = context(X, Y, payload())
        ctx = replace(
            ctx, model=model, global_params={k: v.clone() for k, v in P.model_params(model).items()}
        )
        plugin = make(num_models=num_models, local={"lr": 0.1, "batch_size": 2, "epochs": 1})
        return plugin.client_update(ctx).update["1.running_mean"]

    one, two = update(1), update(2)
    assert one.abs().sum() > 0 and not torch.allclose(one, two)
