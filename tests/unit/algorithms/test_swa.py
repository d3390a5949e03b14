"""SWA and SWAD against plain numpy references on the linear softmax model of reference.py.

The references run full-batch gradient descent with ``reference.grad`` (one batch per epoch, so
shuffling plays no part): SWA's upload is the running mean of the trajectory's snapshots, written
out by hand with Izmailov et al.'s cyclic lr ``(1 - t) a1 + t a2``, ``t = (mod(i - 1, c) + 1) / c``;
SWAD's is the mean of the iterates inside the window Cha et al. define on the validation losses.
"""

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, W0, context, grad, payload, plugin_types

from raysim import registry
from raysim.config.plugins import validate_plugin
from raysim.train.weight_averaging import hold_back_for_selection

X = np.array([[1.0, -2.0], [0.5, 1.5], [-1.0, 0.3], [2.0, 0.1], [0.3, 0.3], [-0.7, -1.2]])
Y = np.array([1, 0, 1, 0, 0, 1])


def make(name, **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def flat(w, b):
    return np.concatenate([np.ravel(w), b])


def uploaded(result):
    return flat(result.update["weight"].numpy(), result.update["bias"].numpy())


def descend(x, y, lrs):
    """The iterates ``w_1 .. w_T`` of full-batch gradient descent from (W0, B0) at these lrs."""
    w, b = W0.astype(np.float32).astype(np.float64), B0.astype(np.float32).astype(np.float64)
    iterates = []
    for lr in lrs:
        gw, gb = grad(w, b, x, y)
        w, b = w - lr * gw, b - lr * gb
        iterates.append(flat(w, b))
    return iterates


THETA0 = flat(W0.astype(np.float32), B0.astype(np.float32)).astype(np.float64)


def test_snapshots_fall_at_equal_intervals_after_the_start():
    swa = plugin_types(make("swa"))
    assert swa.snapshot_steps(32, 0.0, 4) == [8, 16, 24, 32]  # the LSS paper's 4 x 8 epochs
    assert swa.snapshot_steps(10, 0.5, 2) == [8, 10]  # start after 5: intervals of 2.5, rounded up
    assert swa.snapshot_steps(3, 0.0, 5) == [1, 2, 3]  # at most one per step


@pytest.mark.parametrize("schedule", ["constant", "cyclic"])
def test_swa_uploads_the_mean_of_the_snapshots_of_a_hand_computed_trajectory(schedule):
    """8 steps, averaging from step 4 (start_fraction 0.5), 2 snapshots: steps 6 and 8, cycles of
    c = 2. Cyclic: a1 = 0.3 until step 4, then step i = 1..4 after it at (1 - t) a1 + t a2."""
    a1, a2 = 0.3, 0.05
    plugin = make(
        "swa",
        num_models=2,
        start_fraction=0.5,
        lr_schedule=schedule,
        swa_lr=a2,
        local={"lr": a1, "batch_size": len(X), "epochs": 8},
    )
    if schedule == "cyclic":
        t = [((i - 1) % 2 + 1) / 2 for i in range(1, 5)]
        lrs = [a1] * 4 + [(1 - ti) * a1 + ti * a2 for ti in t]
    else:
        lrs = [a1] * 4 + [a2] * 4
    iterates = descend(X, Y, lrs)
    result = plugin.client_update(context(X, Y, payload()))
    assert np.allclose(uploaded(result), THETA0 - (iterates[5] + iterates[7]) / 2, atol=1e-6)
    assert result.metrics["swa/snapshots"] == 2 and result.metrics["train/steps"] == 8
    assert not np.allclose(uploaded(result), THETA0 - iterates[7], atol=1e-4)  # the mean, not the end


def test_one_snapshot_from_the_start_is_fedavg_bit_for_bit():
    local = {"optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4, "batch_size": 2, "epochs": 3}
    fedavg = make("fedavg", local=local).client_update(context(X, Y, payload())).update
    swa = make("swa", num_models=1, local=local).client_update(context(X, Y, payload())).update
    assert all(torch.equal(fedavg[k], swa[k]) for k in fedavg)
    averaged = make("swa", num_models=3, local=local).client_update(context(X, Y, payload())).update
    assert not torch.equal(fedavg["weight"], averaged["weight"])


def test_a_straggler_averages_the_snapshots_it_reached():
    plugin = make("swa", num_models=4, local={"lr": 0.1, "batch_size": len(X), "epochs": 8})
    ctx = replace(context(X, Y, payload()), step_budget=5)
    result = plugin.client_update(ctx)
    iterates = descend(X, Y, [0.1] * 5)
    assert result.metrics["swa/snapshots"] == 2  # steps 2 and 4 of 2, 4, 6, 8
    assert np.allclose(uploaded(result), THETA0 - (iterates[1] + iterates[3]) / 2, atol=1e-6)


def reference_window(losses, start_window, end_window, tolerance):
    """Cha et al. sec. 3.3 on the whole sequence, windows cut at its end."""
    s = next(j for j in range(len(losses)) if losses[j] <= min(losses[j : j + start_window]))
    e = next(
        (j for j in range(s, len(losses)) if min(losses[j : j + end_window]) > tolerance * losses[s]),
        len(losses),
    )
    return s, e


def cross_entropy(theta, x, y):
    z = x @ theta[:4].reshape(2, 2).T + theta[4:]
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def test_swad_uploads_the_mean_of_the_iterates_in_the_reference_window():
    """Validation after every step (``eval_every: 1``): segments are single iterates. Conflicting
    labels make the validation loss fall, then rise past the tolerance: a window with both ends."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (30, 2))
    y = (x[:, 0] > 0).astype(np.int64)
    y[rng.permutation(30)[:9]] ^= 1  # noise the split cannot avoid
    options = {"eval_every": 1, "start_window": 2, "end_window": 2, "tolerance": 1.02, "recompute_bn": False}
    plugin = make("swad", **options, local={"lr": 2.0, "batch_size": 1000, "epochs": 40})
    ctx = context(x, y, payload())
    train, val = hold_back_for_selection(ctx.data, 0.2, ctx.seed)
    xt, yt = train.arrays["x"].astype(np.float64), train.arrays["y"]
    iterates = descend(xt, yt, [2.0] * 40)
    losses = [cross_entropy(theta, val.arrays["x"].astype(np.float64), val.arrays["y"]) for theta in iterates]
    s, e = reference_window(losses, 2, 2, 1.02)
    assert 0 < s and e < 40, (s, e, losses)  # the case exercises both rules
    result = plugin.client_update(ctx)
    assert result.metrics["swad/start"] == s and result.metrics["swad/segments"] == e - s
    assert np.allclose(uploaded(result), THETA0 - np.mean(iterates[s:e], axis=0), atol=1e-5)
    assert result.weight == len(train)


def test_swad_recomputes_batchnorm_statistics_at_the_averaged_weights():
    """With ``recompute_bn`` the uploaded running mean is the mean, over the training split, of the
    BatchNorm's input at the uploaded weights (one pass in one batch); without it, it is not."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    start = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}

    def local_model(recompute_bn):
        model.load_state_dict(start, strict=False)
        params = {k: v.clone() for k, v in start.items()}
        ctx = replace(context(X, Y, payload()), model=model, global_params=params)
        plugin = make("swad", recompute_bn=recompute_bn, local={"lr": 0.1, "batch_size": 5, "epochs": 3})
        delta = plugin.client_update(ctx).update
        return {k: start[k] - delta[k] for k in delta}, ctx

    local, ctx = local_model(True)
    train = hold_back_for_selection(ctx.data, 0.2, ctx.seed)[0].arrays["x"]
    inputs = torch.from_numpy(train) @ local["0.weight"].T + local["0.bias"]
    assert torch.allclose(local["1.running_mean"], inputs.mean(0), atol=1e-6)
    without, _ = local_model(False)
    assert not torch.allclose(without["1.running_mean"], inputs.mean(0), atol=1e-3)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("swa", {"num_models": 0}, "algorithm.num_models: "),
        ("swa", {"start_fraction": 1.0}, "algorithm.start_fraction: "),
        ("swa", {"lr_schedule": "cyclic"}, "algorithm: .*cyclic .* set swa_lr below local.lr"),
        ("swa", {"lr_schedule": "cyclic", "swa_lr": 0.5}, "algorithm: .*swa_lr below local.lr \\(0.05\\)"),
        ("swad", {"selection_fraction": 0.0}, "algorithm.selection_fraction: "),
        ("swad", {"tolerance": 0.9}, "algorithm.tolerance: "),
        ("swad", {"start_window": 0}, "algorithm.start_window: "),
    ],
)
def test_impossible_configs_are_refused_naming_the_key(name, options, message):
    problems: list[str] = []
    assert validate_plugin("algorithm", {"name": name, **options}, problems) is None
    assert len(problems) == 1 and re.search(message, problems[0]), problems
