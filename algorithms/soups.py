"""Model Soups and DiWA as FL baselines: FedAvg whose clients upload a soup of local fine-tunes.

The LSS paper (Chen et al., NeurIPS 2024, arXiv:2410.23660, sec. 4.1) moves
these weight-averaging fine-tuning methods into FL by changing only the client's local training;
the server stays FedAvg (``raysim.train.server_opt``). Each round a client:

1. holds back ``selection_fraction`` of its examples (seeded per client and round) to choose by;
2. fine-tunes ``num_models`` ingredients from the round's global model, each with its own seed and
   hyper-parameters drawn from ``grid`` (the LSS paper: 32 runs of ``local.epochs`` = 8, lr
   {1e-4, 5e-4, 1e-5}, batch {32, 64, 128}, weight decay {5e-4, 5e-5, 5e-6}, dropout {0, 0.1, 0.3});
   each ingredient is its best epoch by held-back accuracy (``keep: best_epoch``) or its last;
3. uploads the soup, ``delta = global - soup``, weighted by the examples trained on:
   - ``recipe: uniform``, the uniform soup of every ingredient (Wortsman et al., ICML 2022,
     arXiv:2203.05482, eq. 1); the LSS paper's "Soups" [our choice: it does not say which];
   - ``recipe: greedy``, Wortsman et al.'s Recipe 1: ingredients by held-back accuracy, best
     first, each kept when the soup's held-back accuracy does not drop.

``diwa`` (Rame et al., NeurIPS 2022, arXiv:2205.09739) is the same procedure, diverse ingredients
from different hyper-parameters and seeds averaged in weight space, with the greedy recipe by
default: the LSS paper's "greedy model selection version of model soups" (their DiWA-restricted).
Soups average every tensor that travels, BatchNorm statistics included (Wortsman et al. average
state dicts). A grid dropout other than 0 sets ``p`` of the model's ``nn.Dropout`` layers for that
ingredient; a model without any is refused. One ingredient, the local hyper-parameters as the
grid's only values, ``keep: last`` and no held-back examples is FedAvg's local run bit for bit.

A straggler's ``step_budget`` is its local steps for the round, all ingredients together (one rule
with LSS's ingredients and FedRep's phases, docs/systems.md): the ingredients train in order on
what is left, the last one reached maybe cut short, and the soup is of those it trained.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator
from torch import nn
from torch.optim import Optimizer

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.measure.evaluate import evaluate
from raysim.registry import register
from raysim.train.batching import Batch
from raysim.train.local import (
    Backward,
    BatchLoss,
    LocalHooks,
    LocalStep,
    LocalTrainConfig,
    examples_trained_on,
    train_context,
)
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.train.weight_averaging import (
    greedy_soup,
    hold_back_for_selection,
    load_params,
    merge_train_metrics,
    snapshot,
    uniform_mean,
)
from raysim.types import (
    ClientContext,
    ClientData,
    ClientMetrics,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
)

_HYPER_TAG, _SEED_TAG = 0x50B1, 0x50B2  # keep the hyper-parameter and shuffling draws apart


class HyperGrid(BaseModel, frozen=True, extra="forbid"):
    """The values each ingredient's hyper-parameters are drawn from, uniformly and independently."""

    lr: list[float] = Field([1e-4, 5e-4, 1e-5], min_length=1)
    batch_size: list[int] = Field([32, 64, 128], min_length=1)
    weight_decay: list[float] = Field([5e-4, 5e-5, 5e-6], min_length=1)
    dropout: list[float] = Field([0.0], min_length=1)  # the paper's {0, 0.1, 0.3} needs nn.Dropout layers

    @model_validator(mode="after")
    def _in_range(self) -> "HyperGrid":
        ranges: list[tuple[str, Sequence[float], Callable[[float], bool]]] = [
            ("lr", self.lr, lambda v: v > 0),
            ("batch_size", self.batch_size, lambda v: v >= 1),
            ("weight_decay", self.weight_decay, lambda v: v >= 0),
            ("dropout", self.dropout, lambda v: 0 <= v < 1),
        ]
        bad = [f"{key} {value}" for key, values, ok in ranges for value in values if not ok(value)]
        if bad:
            raise ValueError(
                f"out of range: {', '.join(bad)} "
                "(lr > 0, batch_size >= 1, weight_decay >= 0, 0 <= dropout < 1)"
            )
        return self


class SoupsConfig(BaseModel, frozen=True, extra="forbid"):
    """Model Soups: clients fine-tune several ingredients and upload their soup (Wortsman et al. 2022)."""

    num_models: int = Field(32, ge=1)  # ingredients per client and round (the LSS paper: 32)
    recipe: Literal["uniform", "greedy"] = "uniform"
    keep: Literal["best_epoch", "last"] = "best_epoch"  # each ingredient's checkpoint
    selection_fraction: float = Field(0.2, ge=0, lt=1)  # of each client's examples, held back per round
    grid: HyperGrid = HyperGrid()
    local: LocalTrainConfig = LocalTrainConfig()  # epochs and optimizer; lr, batch, decay from grid
    server: ServerOptimizerConfig = ServerOptimizerConfig()  # SGD lr 1 == FedAvg
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "it trains several ingredients a round and selects them on held-back examples without noise"

    @model_validator(mode="after")
    def _selection_where_needed(self) -> "SoupsConfig":
        needs = [
            why
            for why, used in (
                ("recipe: greedy", self.recipe == "greedy"),
                ("keep: best_epoch", self.keep == "best_epoch"),
            )
            if used
        ]
        if needs and self.selection_fraction == 0:
            raise ValueError(
                f"{' and '.join(needs)} need held-back accuracy: set selection_fraction above 0 "
                "(0.2 is our choice; the LSS paper gives no size), or recipe: uniform with keep: last"
            )
        return self


class DiWAConfig(SoupsConfig, frozen=True):
    """DiWA: diverse fine-tunes averaged in weight space, greedily selected (Rame et al. 2022)."""

    recipe: Literal["uniform", "greedy"] = "greedy"


@dataclass(frozen=True)
class Hyper:
    """One ingredient's draw from the grid."""

    lr: float
    batch_size: int
    weight_decay: float
    dropout: float


def draw_hyperparameters(grid: HyperGrid, seed: int, ingredient: int) -> Hyper:
    """Ingredient ``ingredient``'s hyper-parameters: one value per axis, uniformly; a pure function."""
    rng = np.random.default_rng([seed, _HYPER_TAG, ingredient])
    return Hyper(
        lr=float(rng.choice(grid.lr)),
        batch_size=int(rng.choice(grid.batch_size)),
        weight_decay=float(rng.choice(grid.weight_decay)),
        dropout=float(rng.choice(grid.dropout)),
    )


@contextmanager
def dropout_rate(model: nn.Module, p: float) -> Iterator[None]:
    """Every ``nn.Dropout`` of the model at rate ``p`` inside the block (0: the model's own rates).
    The worker restores weights between clients, not module attributes: the old rates come back."""
    layers = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    if p > 0 and not layers:
        raise ValueError(
            f"algorithm.grid.dropout: {p} needs nn.Dropout layers and the model has none: "
            "set grid.dropout: [0.0]"
        )
    old = [m.p for m in layers]
    if p > 0:
        for m in layers:
            m.p = p
    try:
        yield
    finally:
        for m, rate in zip(layers, old):
            m.p = rate


@dataclass
class _Best:
    """The best checkpoint of one ingredient so far, by held-back accuracy."""

    params: Params | None = None
    accuracy: float = -math.inf


def best_epoch_step(batches_per_epoch: int, best: _Best, accuracy_of: "_Accuracy") -> LocalStep:
    """A plain step that, at each epoch's end, keeps the weights when their held-back accuracy
    is the best yet."""
    steps = 0

    def step(model: nn.Module, batch: Batch, optimizer: Optimizer, backward: Backward) -> BatchLoss:
        nonlocal steps
        loss = backward(batch)
        optimizer.step()
        steps += 1
        if steps % batches_per_epoch == 0:
            _keep_if_better(model, best, accuracy_of)
        return loss

    return step


class _Accuracy:
    """Held-back accuracy of a model as it stands, leaving it in train mode."""

    def __init__(self, held_back: ClientData, ctx: ClientContext[None, None]) -> None:
        self.held_back, self.ctx = held_back, ctx

    def __call__(self, model: nn.Module) -> float:
        accuracy = evaluate(model, self.held_back, self.ctx.spec, self.ctx.device)["accuracy"]
        model.train()
        return accuracy


def _keep_if_better(model: nn.Module, best: _Best, accuracy_of: _Accuracy) -> None:
    accuracy = accuracy_of(model)
    if accuracy > best.accuracy:
        best.params, best.accuracy = snapshot(model), accuracy


@register("algorithm", "soups", config=SoupsConfig)
@register("algorithm", "diwa", config=DiWAConfig)
class Soups:
    """Model Soups / DiWA: FedAvg whose clients upload a soup of local fine-tunes."""

    Config = SoupsConfig

    def __init__(self, config: SoupsConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        config, model = self.config, ctx.model
        if config.selection_fraction > 0:
            train, held_back = hold_back_for_selection(ctx.data, config.selection_fraction, ctx.seed)
            accuracy_of: _Accuracy | None = _Accuracy(held_back, ctx)
        else:
            train, accuracy_of = ctx.data, None
        start = snapshot(model)  # the round's global model, BatchNorm statistics included
        ingredients: list[Params] = []
        accuracies: list[float] = []
        runs: list[ClientMetrics] = []
        steps_left = ctx.step_budget
        for i in range(config.num_models):
            if steps_left is not None and steps_left <= 0:
                break  # a straggler's budget is spent: the soup is of the ingredients it trained
            load_params(model, start)
            best, metrics = self._fine_tune(replace(ctx, step_budget=steps_left), train, i, accuracy_of)
            runs.append(metrics)
            ingredients.append(best.params if best.params is not None else snapshot(model))
            accuracies.append(best.accuracy)
            if steps_left is not None:
                steps_left -= int(metrics["train/steps"])
        ingredients = ingredients or [start]  # a budget of 0: nothing trained, the soup is the start
        chosen = list(range(len(ingredients)))
        if config.recipe == "greedy" and runs:
            assert accuracy_of is not None  # the config refuses greedy without held-back examples
            score = accuracy_of

            def soup_accuracy(members: list[int]) -> float:
                load_params(model, uniform_mean([ingredients[j] for j in members]))
                return score(model)

            chosen = greedy_soup(accuracies, soup_accuracy)
        load_params(model, uniform_mean([ingredients[j] for j in chosen]))
        metrics = merge_train_metrics(runs) | {
            "soup/ingredients": float(len(runs)),
            "soup/selected": float(len(chosen)),
        }
        if accuracy_of is not None:
            metrics["soup/val_accuracy"] = accuracy_of(model)
        delta = P.delta(ctx.global_params, P.model_params(model))
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def _fine_tune(
        self, ctx: ClientContext[None, None], train: ClientData, i: int, accuracy_of: _Accuracy | None
    ) -> tuple[_Best, ClientMetrics]:
        """Ingredient ``i`` from the model's current weights, within ``ctx.step_budget`` (the steps
        the client has left); its kept checkpoint (with ``keep: last``, the live model; its accuracy
        when examples are held back) and its train metrics."""
        config = self.config
        hyper = draw_hyperparameters(config.grid, ctx.seed, i)
        local = config.local.model_copy(
            update={"lr": hyper.lr, "batch_size": hyper.batch_size, "weight_decay": hyper.weight_decay}
        )
        # the first ingredient shuffles as FedAvg does, so one ingredient is FedAvg's run
        seed = (
            ctx.seed if i == 0 else int(np.random.SeedSequence([ctx.seed, _SEED_TAG, i]).generate_state(1)[0])
        )
        best = _Best()
        step = None
        if accuracy_of is not None and config.keep == "best_epoch":
            step = best_epoch_step(math.ceil(len(train) / hyper.batch_size), best, accuracy_of)
        with dropout_rate(ctx.model, hyper.dropout):
            metrics = train_context(replace(ctx, data=train, seed=seed), local, LocalHooks(step=step))
        if config.keep == "last":
            accuracy = accuracy_of(ctx.model) if accuracy_of is not None else -math.inf
            return _Best(snapshot(ctx.model), accuracy), metrics
        if accuracy_of is not None and metrics["train/steps"] % math.ceil(len(train) / hyper.batch_size) != 0:
            _keep_if_better(ctx.model, best, accuracy_of)  # a last epoch cut short (max_steps, a budget)
        return best, metrics

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
