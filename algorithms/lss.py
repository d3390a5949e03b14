"""LSS, Local Superior Soups (Chen, Jiang, Zhang et al., NeurIPS 2024, arXiv:2410.23660).

Only local training changes; the server is FedAvg. Each client grows a pool of N models
("ingredients") from the round's start model ``f_p`` (Chen et al., NeurIPS 2024,
arXiv:2410.23660, Alg. 1):

    for i = 1..N:
        theta_i <- mean(pool)             # f_p for the first; a fresh optimizer for each
        pool    <- pool + [theta_i]       # earlier ingredients are frozen
        for every batch of ``epochs`` epochs:
            alpha ~ Dirichlet(1, ..., 1) over the pool        # a fresh mix per batch
            L = CE(f(x; sum_m alpha_m theta_m), y)           # gradient reaches theta_i only
                + lambda_a * affinity(theta_i, f_p) - lambda_d * diversity(theta_i, pool)
    upload mean(pool)                     # one model: FedAvg's traffic

``reading: paper`` (the default) takes the paper's forms: ``affinity = ||theta_i - f_p||_2`` and
``diversity = (1/|pool|) sum_m ||theta_i - theta_m||_2`` (the self-term is 0 and left out),
lambda_a = lambda_d = 3, every ingredient trains ``local.epochs`` epochs, one mix per batch.
``reading: lss_code`` is the released code (github ubc-tea/Local-Superior-Soups, 1e244c0):
squared L2 affinity, the squared volume of the simplex the pool spans (Cayley-Menger)
as diversity, lambda_a = lambda_d = 1e-3, ingredients after the first train ``local.epochs // 8``
epochs (at least 1), and two mixes per batch whose losses are summed and divided by 15, the code's
gradient-accumulation step. Its later ingredients' loss (the first mixes nothing: plain CE) is
``sum_s CE_s / 15 - div * V^2 + aff * ||theta - f_p||^2``, so its regularisers weigh 7.5 times
more against the task than under a mean of the two (``mix_loss_scale``; the paper's one mix is its
own mean). The code then steps once per 15 batches with ``zero_grad`` in between, so only every
15th batch's gradient counts; here every batch steps (that quirk is not reproduced). Each of these
can be set on its own. The code's other settings (Adam without weight decay, batch 128, N = 3) are
the job's (``jobs/lss/``).

A single ingredient has nothing to mix with: it trains on its own loss, so N = 1 without affinity is
FedAvg bit for bit. ``start_in_pool`` takes Alg. 1 literally: ``f_p`` is a frozen pool member, in
every mix, in the diversity term and in the upload (N + 1 members); off by default (as the authors'
code). BatchNorm statistics are the live model's, updated by every mixed forward pass and sent as
they end (as the authors' code; the paper is silent). Mixing coefficients are a pure function of the
client's seed, the ingredient and the batch (``mix_coefficients``). ``local.max_steps`` caps each
ingredient's batches; a straggler's ``step_budget`` caps those of all ingredients together (it
finishes fewer).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field, field_validator
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.at_weights import at_weights
from raysim.train.batching import Batch
from raysim.train.local import (
    Backward,
    BatchLoss,
    ExtraLoss,
    LocalHooks,
    LocalStep,
    LocalTrainConfig,
    LossFn,
    examples_trained_on,
    task_loss,
    train_context,
)
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import (
    ClientContext,
    ClientMetrics,
    ClientResult,
    DataSpec,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
)

Reading = Literal["paper", "lss_code"]
_WEIGHT = {"paper": 3.0, "lss_code": 1e-3}  # lambda_a and lambda_d (paper E.1; the code's defaults)
_MIXES = {"paper": 1, "lss_code": 2}  # mixes per batch (Alg. 1; the code's n_soups_sampling)
_CODE_ACCUMULATION = 15  # the code divides its summed mix losses by its accumulation step (the authors' code)
_MIX_TAG, _SHUFFLE_TAG = 0x1550, 0x1551  # keep the mixing and shuffling streams apart
_EPS = 1e-12  # ||.||_2 = sqrt(sum sq + eps): a defined gradient where theta_i == f_p


class LSSConfig(BaseModel, frozen=True, extra="forbid"):
    """LSS: each client trains a pool of N models on random mixes of it and uploads the pool mean."""

    num_models: int = 4  # N, the ingredients each client trains ("4x Mem." in the paper's tables)
    affinity: float | None = Field(None, ge=0)  # lambda_a; None: the reading's (paper 3, lss_code 1e-3)
    diversity: float | None = Field(None, ge=0)  # lambda_d; None: the reading's (paper 3, lss_code 1e-3)
    later_epochs: int | None = Field(None, ge=1)  # ingredients 2..N; None: the reading's (module doc)
    mixes_per_batch: int | None = Field(None, ge=1)  # None: the reading's (paper 1, code 2)
    # the factor on the sum of a batch's mix losses; None: the reading's (paper: their mean; lss_code 1/15)
    mix_loss_scale: float | None = Field(None, gt=0)
    start_in_pool: bool = False  # Alg. 1 literally: f_p is a frozen member (module docstring)
    reading: Reading = "paper"  # the paper's forms and values, or the released code's (module doc)
    local: LocalTrainConfig = LocalTrainConfig()  # the paper: adam, lr 5e-4, weight_decay 5e-4, 8 epochs
    server: ServerOptimizerConfig = ServerOptimizerConfig()  # SGD lr 1 == FedAvg
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "its regulariser (an extra_loss) and its mixing step are no loss of one example alone"

    @field_validator("num_models")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"num_models is N, the models each client trains and averages: at least 1 (1 is "
                f"FedAvg plus the affinity term; the paper uses 4), got {value}"
            )
        return value

    @property
    def affinity_weight(self) -> float:
        return _WEIGHT[self.reading] if self.affinity is None else self.affinity

    @property
    def diversity_weight(self) -> float:
        return _WEIGHT[self.reading] if self.diversity is None else self.diversity

    @property
    def num_mixes(self) -> int:
        return _MIXES[self.reading] if self.mixes_per_batch is None else self.mixes_per_batch

    @property
    def task_scale(self) -> float | None:
        """The factor on the sum of a batch's mix losses against the full-weight regularisers; None:
        their mean (the paper's reading)."""
        if self.mix_loss_scale is not None:
            return self.mix_loss_scale
        return None if self.reading == "paper" else 1 / _CODE_ACCUMULATION

    def ingredient_epochs(self, ingredient: int) -> int:
        """Local epochs of ingredient ``ingredient`` (0-based)."""
        if ingredient == 0:
            return self.local.epochs
        if self.later_epochs is not None:
            return self.later_epochs
        return self.local.epochs if self.reading == "paper" else max(1, self.local.epochs // 8)


def mix_coefficients(
    seed: int, ingredient: int, batch_num: int, num_members: int, num_mixes: int
) -> np.ndarray:
    """Dirichlet(1, ..., 1) coefficients, ``(num_mixes, num_members)``: uniform on the simplex (as
    the authors' code draws them); the last column weighs the live ingredient. A pure function of
    its arguments."""
    rng = np.random.default_rng([seed, _MIX_TAG, ingredient, batch_num])
    return rng.dirichlet(np.ones(num_members), size=num_mixes)


def live_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """The trainable parameters: the pooled ones (BatchNorm statistics are buffers, as in the code)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def mixed_loss(
    frozen: list[Params], alphas: np.ndarray, task: LossFn = task_loss, scale: float | None = None
) -> LossFn:
    """The task loss at ``sum_m alpha_m theta_m`` (frozen members, then the live model) for each
    row of ``alphas``: their sum times ``scale`` (None: their mean); autograd reaches the live
    model only, scaled by its alpha."""

    def loss_fn(model: nn.Module, batch: Batch, spec: DataSpec) -> BatchLoss:
        live = live_params(model)
        losses: list[torch.Tensor] = []
        correct: torch.Tensor | int = 0
        count: torch.Tensor | int = 0
        for *weights, own in alphas.tolist():
            mix = {
                name: own * p + sum(w * member[name] for w, member in zip(weights, frozen))
                for name, p in live.items()
            }
            loss, num_correct, num_items = task(at_weights(model, mix), batch, spec)
            losses.append(loss)
            correct, count = correct + num_correct, count + num_items
        total = torch.stack(losses)
        return (total.mean() if scale is None else scale * total.sum()), correct, count

    return loss_fn


def squared_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``||a - b||^2`` over all the tensors of ``a``."""
    return torch.stack([(t - b[name]).pow(2).sum() for name, t in a.items()]).sum()


def l2_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``||a - b||_2``, with a defined gradient at ``a == b`` (LSS paper, Sec. 3.3.2-3.3.3)."""
    return torch.sqrt(squared_distance(a, b) + _EPS)


def squared_simplex_volume(squared_edges: torch.Tensor) -> torch.Tensor:
    """The squared (n-1)-volume of the simplex whose n vertices have these squared distances
    ``(n, n)``: ``|det CM| / ((n-1)!^2 2^(n-1))``, CM the Cayley-Menger matrix ``[[D2, 1], [1^T, 0]]``."""
    n = squared_edges.shape[0]
    cm = F.pad(squared_edges, (0, 1, 0, 1), value=1.0)
    corner = torch.zeros_like(cm)
    corner[n, n] = 1.0
    volume_squared: torch.Tensor = torch.linalg.det(cm - corner).abs() / (
        math.factorial(n - 1) ** 2 * 2 ** (n - 1)
    )
    return volume_squared


def regularizer(config: LSSConfig, anchor: Params, frozen: list[Params]) -> ExtraLoss | None:
    """``lambda_a * affinity - lambda_d * diversity`` of the live ingredient, in the reading's forms;
    None when neither term can act (no weight, or no other member to be diverse from)."""
    lambda_a, lambda_d = config.affinity_weight, config.diversity_weight
    if not frozen:
        lambda_d = 0.0
    if lambda_a == 0 and lambda_d == 0:
        return None
    is_paper = config.reading == "paper"
    # the frozen members' squared distances to each other: the code's simplex edges that never change
    fixed = torch.zeros(len(frozen), len(frozen), dtype=torch.float64)  # float64: a determinant follows
    if not is_paper:
        for (j, m), (k, n) in itertools.combinations(enumerate(frozen), 2):
            fixed[j, k] = fixed[k, j] = float(squared_distance(m, n))

    def extra_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        live = live_params(model)
        affinity = l2_distance(live, anchor) if is_paper else squared_distance(live, anchor)
        if lambda_d == 0:
            return lambda_a * affinity
        if is_paper:  # the mean over the pool, the live model's own distance (0) included
            diversity = torch.stack([l2_distance(live, m) for m in frozen]).sum() / (len(frozen) + 1)
        else:
            to_live = torch.stack([squared_distance(live, m) for m in frozen]).double()  # (k,)
            upper = torch.cat([fixed.to(to_live.device), to_live[:, None]], 1)  # (k, k + 1)
            edges = torch.cat([upper, F.pad(to_live, (0, 1))[None]])  # (k + 1, k + 1), D2 of the pool
            diversity = squared_simplex_volume(edges).to(affinity.dtype)
        return lambda_a * affinity - lambda_d * diversity

    return extra_loss


def mixing_step(
    frozen: list[Params],
    coefficients: Callable[[int], np.ndarray],
    task: LossFn = task_loss,
    scale: float | None = None,
) -> LocalStep:
    """A ``train_local`` step on the loss at a fresh mix of the pool (``coefficients(batch_num)``),
    the mixes' losses weighed as ``mixed_loss``'s ``scale`` says; its metrics count their mean."""
    batch_nums = itertools.count()

    def step(
        model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss:
        alphas = coefficients(next(batch_nums))
        loss, num_correct, num_items = backward(batch, mixed_loss(frozen, alphas, task, scale))
        optimizer.step()
        if scale is not None:  # the metrics' loss is the mixes' mean, however the objective weighs it
            loss = loss / (scale * len(alphas))
        return loss, num_correct, num_items

    return step


def set_to_mean(model: nn.Module, members: list[Params]) -> None:
    """Copies the uniform average of ``members`` into the model's trainable parameters."""
    with torch.no_grad():
        for name, p in live_params(model).items():
            p.copy_(torch.stack([m[name] for m in members]).mean(0))


@register("algorithm", "lss")
class LSS:
    """LSS: FedAvg whose clients upload the mean of a locally grown pool of N models."""

    Config = LSSConfig

    def __init__(self, config: LSSConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        config, model = self.config, ctx.model
        anchor = {name: p.detach().clone() for name, p in live_params(model).items()}  # f_p
        pool = [anchor] if config.start_in_pool else []
        runs: list[ClientMetrics] = []
        steps_left = ctx.step_budget
        for i in range(config.num_models):
            if steps_left is not None and steps_left <= 0:
                break  # a straggler's budget is spent: it uploads the ingredients it finished
            if pool:
                set_to_mean(model, pool)
            runs.append(self._train_ingredient(ctx, i, pool, anchor, steps_left))
            pool.append({name: p.detach().clone() for name, p in live_params(model).items()})
            if steps_left is not None:
                steps_left -= int(runs[-1]["train/steps"])
        pool = pool or [anchor]  # a budget of 0: nothing trained, the soup is f_p
        set_to_mean(model, pool)  # the soup; BatchNorm statistics as the last ingredient left them
        delta = P.delta(ctx.global_params, P.model_params(model))
        weight = examples_trained_on(runs[0]) if runs else 0.0  # the examples the first one saw
        return ClientResult(delta, weight, _pool_metrics(runs, pool, anchor))

    def _train_ingredient(
        self, ctx: ClientContext[None, None], i: int, frozen: list[Params], anchor: Params, steps: int | None
    ) -> ClientMetrics:
        """Trains the live model as ingredient ``i`` beside the ``frozen`` members."""
        config = self.config
        num_members = len(frozen) + 1

        def coefficients(batch_num: int) -> np.ndarray:
            return mix_coefficients(ctx.seed, i, batch_num, num_members, config.num_mixes)

        # the first ingredient shuffles as FedAvg does, so N = 1 is FedAvg's run
        shuffle = np.random.SeedSequence([ctx.seed, _SHUFFLE_TAG, i]).generate_state(1)[0]
        seed = ctx.seed if i == 0 else int(shuffle)
        return train_context(
            replace(ctx, seed=seed, step_budget=steps),
            config.local.model_copy(update={"epochs": config.ingredient_epochs(i)}),
            LocalHooks(
                extra_loss=regularizer(config, anchor, frozen),
                step=mixing_step(frozen, coefficients, scale=config.task_scale) if frozen else None,
            ),
        )

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)


def _pool_metrics(runs: list[ClientMetrics], pool: list[Params], anchor: Params) -> ClientMetrics:
    """The ingredients' train metrics (loss and accuracy: step-weighted means; steps: the sum) and
    the pool's shape: ``lss/soup_distance`` (``||soup - f_p||``) and ``lss/spread`` (the mean
    distance of the members to the soup)."""
    steps = sum(run["train/steps"] for run in runs)
    soup = {name: torch.stack([m[name] for m in pool]).mean(0) for name in anchor}
    return {
        "train/loss": sum(run["train/loss"] * run["train/steps"] for run in runs) / max(steps, 1.0),
        "train/accuracy": sum(run["train/accuracy"] * run["train/steps"] for run in runs) / max(steps, 1.0),
        "train/steps": steps,
        "train/num_examples": max((run["train/num_examples"] for run in runs), default=0.0),
        "lss/ingredients": float(len(runs)),
        "lss/soup_distance": float(squared_distance(soup, anchor).sqrt()),
        "lss/spread": float(np.mean([float(squared_distance(m, soup).sqrt()) for m in pool])),
    }
