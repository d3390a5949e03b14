"""Model Soups and DiWA against plain numpy references on the linear softmax model of reference.py.

Each ingredient of the reference is full-batch gradient descent from (W0, B0) with ``reference.grad``
at the lr the plugin drew for it (``draw_hyperparameters``, tested apart); the greedy reference is
Wortsman et al.'s Recipe 1 written out as a loop over numpy accuracies.
"""

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, W0, context, grad, payload, plugin_types
from torch.optim.optimizer import register_optimizer_step_post_hook

from raysim import registry
from raysim.config.plugins import validate_plugin
from raysim.train.weight_averaging import hold_back_for_selection

RNG = np.random.default_rng(3)
X = RNG.normal(0, 1, (40, 2))
Y = ((X[:, 0] + 0.3 * X[:, 1]) > 0).astype(np.int64)
Y[:6] ^= 1  # some noise, so that ingredients and soups differ in held-back accuracy
THETA0 = np.concatenate([W0.ravel(), B0]).astype(np.float32).astype(np.float64)


def make(name, **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def uploaded(result):
    return np.concatenate([result.update["weight"].numpy().ravel(), result.update["bias"].numpy()])


def descend(x, y, lr, steps):
    """The iterates of full-batch gradient descent from (W0, B0)."""
    theta, iterates = THETA0.copy(), []
    for _ in range(steps):
        gw, gb = grad(theta[:4].reshape(2, 2), theta[4:], x, y)
        theta = theta - lr * np.concatenate([gw.ravel(), gb])
        iterates.append(theta)
    return iterates


def accuracy(theta, x, y):
    return float(np.mean((x @ theta[:4].reshape(2, 2).T + theta[4:]).argmax(1) == y))


def test_hyperparameters_are_drawn_from_the_grid_as_a_pure_function():
    plugin = make("soups")
    soups = plugin_types(plugin)
    grid = plugin.config.grid
    draws = [soups.draw_hyperparameters(grid, 5, i) for i in range(200)]
    assert {d.lr for d in draws} == set(grid.lr) and {d.batch_size for d in draws} == set(grid.batch_size)
    assert {d.weight_decay for d in draws} == set(grid.weight_decay)
    assert soups.draw_hyperparameters(grid, 5, 7) == draws[7] != soups.draw_hyperparameters(grid, 6, 7)


def test_one_ingredient_with_the_local_values_is_fedavg_bit_for_bit():
    local = {"optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4, "batch_size": 4, "epochs": 3}
    grid = {"lr": [0.01], "batch_size": [4], "weight_decay": [5e-4]}
    fedavg = make("fedavg", local=local).client_update(context(X, Y, payload())).update
    options = {"num_models": 1, "keep": "last", "selection_fraction": 0.0, "grid": grid, "local": local}
    soup = make("soups", **options).client_update(context(X, Y, payload())).update
    assert all(torch.equal(fedavg[k], soup[k]) for k in fedavg)


def test_the_uniform_soup_is_the_mean_of_the_reference_ingredients():
    """Three ingredients, keep: last, no validation: the mean of three GD runs at the drawn lrs."""
    grid = {"lr": [0.05, 0.5, 2.0], "batch_size": [len(X)], "weight_decay": [0.0]}
    plugin = make("soups", num_models=3, keep="last", selection_fraction=0.0, grid=grid, local={"epochs": 4})
    soups = plugin_types(plugin)
    lrs = [soups.draw_hyperparameters(plugin.config.grid, 0, i).lr for i in range(3)]
    ingredients = [descend(X, Y, lr, 4)[-1] for lr in lrs]
    result = plugin.client_update(context(X, Y, payload()))
    assert np.allclose(uploaded(result), THETA0 - np.mean(ingredients, axis=0), atol=1e-5)
    assert result.metrics["soup/ingredients"] == 3 == result.metrics["soup/selected"]


@pytest.mark.parametrize("name", ["soups", "diwa"])
def test_the_greedy_soup_and_best_epochs_match_the_reference(name):
    """Four ingredients on 80% of the data, each its best epoch by held-back accuracy (the first
    best), then Recipe 1 on the held-back 20%; DiWA is greedy by default."""
    grid = {"lr": [0.01, 0.3, 1.0, 3.0], "batch_size": [1000], "weight_decay": [0.0]}
    options = {"recipe": "greedy"} if name == "soups" else {}
    plugin = make(name, num_models=4, grid=grid, local={"epochs": 5}, **options)
    soups = plugin_types(plugin)
    ctx = context(X, Y, payload())
    train, val = hold_back_for_selection(ctx.data, 0.2, ctx.seed)
    xt, yt = train.arrays["x"].astype(np.float64), train.arrays["y"]
    xv, yv = val.arrays["x"].astype(np.float64), val.arrays["y"]
    ingredients, scores = [], []
    for i in range(4):
        epochs = descend(xt, yt, soups.draw_hyperparameters(plugin.config.grid, ctx.seed, i).lr, 5)
        accuracies = [accuracy(theta, xv, yv) for theta in epochs]
        ingredients.append(epochs[int(np.argmax(accuracies))])
        scores.append(max(accuracies))
    order = sorted(range(4), key=lambda i: -scores[i])
    soup, best = [order[0]], scores[order[0]]
    for i in order[1:]:
        candidate = accuracy(np.mean([ingredients[j] for j in [*soup, i]], axis=0), xv, yv)
        if candidate >= best:
            soup, best = [*soup, i], candidate
    result = plugin.client_update(ctx)
    assert np.allclose(uploaded(result), THETA0 - np.mean([ingredients[j] for j in soup], axis=0), atol=1e-5)
    assert result.metrics["soup/selected"] == len(soup) and result.metrics["soup/val_accuracy"] == best
    assert result.weight == len(train)


def test_a_grid_dropout_sets_the_rate_during_training_and_restores_it():
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ctx = replace(context(X, Y, payload()), model=model, global_params=start)
    grid = {"lr": [0.1], "batch_size": [8], "weight_decay": [0.0], "dropout": [0.3]}
    plugin = make("soups", num_models=1, keep="last", selection_fraction=0.0, grid=grid)
    seen = []
    model[1].register_forward_pre_hook(lambda module, args: seen.append(module.p))
    plugin.client_update(ctx)
    assert set(seen) == {0.3} and model[1].p == 0.5
    ctx = context(X, Y, payload())  # a linear model has no dropout layer to set
    with pytest.raises(
        ValueError, match=r"algorithm.grid.dropout: 0.3 needs nn.Dropout .* grid.dropout: \[0.0\]"
    ):
        plugin.client_update(ctx)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("soups", {"num_models": 0}, "algorithm.num_models: "),
        (
            "soups",
            {"recipe": "greedy", "selection_fraction": 0.0},
            "algorithm: recipe: greedy and keep: best_epoch",
        ),
        (
            "soups",
            {"selection_fraction": 0.0},
            "algorithm: keep: best_epoch need held-back accuracy.* keep: last",
        ),
        (
            "diwa",
            {"keep": "last", "selection_fraction": 0.0},
            "algorithm: recipe: greedy need held-back accuracy",
        ),
        ("soups", {"grid": {"lr": []}}, "algorithm.grid.lr: "),
        ("soups", {"grid": {"lr": [0.1, -1.0], "dropout": [1.0]}}, "algorithm.grid: .*lr -1.0, dropout 1.0"),
        ("soups", {"recipe": "best"}, "algorithm.recipe: .*uniform.*greedy"),
    ],
)
def test_impossible_configs_are_refused_naming_the_key(name, options, message):
    problems: list[str] = []
    assert validate_plugin("algorithm", {"name": name, **options}, problems) is None
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def feature_case():
    from feature_reference import feature_context

    return feature_context(X[:3], Y[:3] + np.array([0, 1, 0]))  # three classes for FedRep's head


@pytest.mark.parametrize(
    ("name", "options", "full", "budget"),
    [
        # 32 training rows in batches of 8: 4 steps an epoch, 8 an ingredient, 24 in all
        ("soups", {"num_models": 3, "local": {"epochs": 2}, "grid": {"batch_size": [8]}}, 24, 13),
        ("diwa", {"num_models": 3, "local": {"epochs": 2}, "grid": {"batch_size": [8]}}, 24, 13),
        # 40 rows in batches of 8: 5 steps an epoch, 10 an ingredient, 30 in all
        ("lss", {"num_models": 3, "local": {"epochs": 2, "batch_size": 8, "lr": 0.01}}, 30, 13),
        # one full batch an epoch: 2 head steps, then 3 body steps
        ("fedrep", {"head_epochs": 2, "local": {"epochs": 3, "batch_size": 8}}, 5, 4),
    ],
)
def test_a_step_budget_is_the_clients_steps_in_total_across_ingredients_and_phases(
    name, options, full, budget
):
    """One rule for the plugins that train several times a round: a straggler's budget of k steps
    (``ClientContext.step_budget``) is k optimizer steps in all, not k per ingredient or phase;
    without a budget the client takes its full work."""
    plugin = make(name, **options)
    steps = []
    hook = register_optimizer_step_post_hook(lambda *_: steps.append(1))  # every optimizer's steps
    try:
        for step_budget, expected in ((None, full), (budget, budget)):
            steps.clear()
            ctx = feature_case() if name == "fedrep" else context(X, Y, payload())
            plugin.client_update(replace(ctx, step_budget=step_budget))
            assert len(steps) == expected, (step_budget, len(steps))
    finally:
        hook.remove()
