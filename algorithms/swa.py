"""SWA and SWAD as FL baselines: FedAvg whose clients upload an average along their local trajectory.

The LSS paper (Chen et al., NeurIPS 2024, arXiv:2410.23660, sec. 4.1) moves
these centralized weight-averaging methods into FL by changing only the client's local training;
the server stays FedAvg (``raysim.train.server_opt``).

- **SWA** (Izmailov et al., UAI 2018, arXiv:1803.05407, Algorithm 1): train ``local.epochs``; after
  ``start_fraction`` of the local steps, average ``num_models`` snapshots taken at equal intervals
  up to the last step (the LSS paper: 4 snapshots, 8 epochs apart, from the round's start). The lr
  after the start is constant (``swa_lr``, the local lr when unset) or cyclic: within each interval
  it falls linearly from the local lr (alpha_1) to ``swa_lr`` (alpha_2), reached at the snapshot.
- **SWAD** (Cha et al., NeurIPS 2021, arXiv:2102.08604, sec. 3.3): average *every* iterate (dense)
  inside an overfit-aware window read off the loss on held-back examples, evaluated every ``eval_every`` steps
  on a split held back from the client's data (``raysim.train.weight_averaging.LossValley``):
  from the first evaluation whose loss is the lowest of the next ``start_window`` (N_s = 3), until
  ``end_window`` (N_e = 6) losses in a row exceed ``tolerance`` (r = 1.3, khanrc/swad's
  tolerance_ratio 0.3) times the loss where averaging started. The released code takes the mean
  loss of the start window as that base; we take the paper's loss at the start.

Both recompute BatchNorm statistics at the averaged weights with one pass over the training data
(``recompute_bn``; Izmailov et al. sec. 3.2) and upload ``delta = global - average``, weighted by
the examples trained on. One SWA snapshot from the round's start with a constant lr is FedAvg's
local run. A straggler's ``step_budget`` ends training early: SWA averages the snapshots it
reached (none: its last weights), SWAD closes the window at its last step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

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
    round_epochs,
    round_lr,
    train_context,
)
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.train.weight_averaging import (
    LossValley,
    RunningMean,
    Segment,
    hold_back_for_selection,
    load_params,
    recompute_batchnorm,
)
from raysim.types import (
    ClientContext,
    ClientData,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
)


class SWAConfig(BaseModel, frozen=True, extra="forbid"):
    """SWA: clients upload the average of snapshots along their local trajectory (Izmailov et al. 2018)."""

    num_models: int = Field(4, ge=1)  # snapshots averaged (the LSS paper: 4)
    start_fraction: float = Field(0.0, ge=0, lt=1)  # of the local steps, trained before averaging
    lr_schedule: Literal["constant", "cyclic"] = "constant"
    # constant: the lr after the start; cyclic: alpha_2, where each interval ends. None: local.lr
    swa_lr: float | None = Field(None, gt=0)
    recompute_bn: bool = True  # one pass over the training data at the averaged weights
    local: LocalTrainConfig = LocalTrainConfig()  # epochs: the whole local budget (the paper: 4 x 8)
    server: ServerOptimizerConfig = ServerOptimizerConfig()  # SGD lr 1 == FedAvg
    weighted: bool = True

    @model_validator(mode="after")
    def _cyclic_needs_a_lower_end(self) -> "SWAConfig":
        if self.lr_schedule == "cyclic" and (self.swa_lr is None or self.swa_lr >= self.local.lr):
            raise ValueError(
                "lr_schedule: cyclic falls in each interval from local.lr to swa_lr: set swa_lr below "
                f"local.lr ({self.local.lr}), or lr_schedule: constant"
            )
        return self


class SWADConfig(BaseModel, frozen=True, extra="forbid"):
    """SWAD: clients upload the dense mean of their iterates in an overfit-aware window (Cha et al. 2021)."""

    eval_every: int | None = Field(None, ge=1)  # steps between held-back evaluations; None: once per epoch
    start_window: int = Field(3, ge=1)  # N_s: averaging starts at the lowest loss of N_s evaluations
    end_window: int = Field(6, ge=1)  # N_e: it ends once N_e losses in a row exceed tolerance x the start's
    tolerance: float = Field(1.3, ge=1)  # r
    selection_fraction: float = Field(0.2, gt=0, lt=1)  # of each client's examples, held back per round
    recompute_bn: bool = True
    local: LocalTrainConfig = LocalTrainConfig()  # epochs: the whole local budget (the LSS paper: SWA's 32)
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "it picks its averaging window by the loss on held-back examples, without noise"


def planned_steps(num_examples: int, local: LocalTrainConfig, round_num: int) -> int:
    """The local steps ``train_local`` takes without a straggler's budget: the epochs' batches,
    within ``local.max_steps``."""
    steps = round_epochs(local, round_num) * math.ceil(num_examples / local.batch_size)
    return steps if local.max_steps is None else min(steps, local.max_steps)


def snapshot_steps(total: int, start_fraction: float, num_models: int) -> list[int]:
    """The 1-based steps after which SWA takes its snapshots: ``num_models`` at equal intervals
    after ``floor(start_fraction * total)`` steps, the last at ``total`` (at most one per step)."""
    start = math.floor(start_fraction * total)
    return sorted({start + math.ceil(k * (total - start) / num_models) for k in range(1, num_models + 1)})


def swa_lr(
    step: int, snapshots: list[int], start: int, alpha_1: float, alpha_2: float, is_cyclic: bool
) -> float:
    """The lr of 1-based ``step``: alpha_1 up to ``start``; then alpha_2, or with ``is_cyclic``
    ``(1 - t) alpha_1 + t alpha_2`` where ``t`` is the step's place in its interval, 1 at its snapshot."""
    if step <= start or not snapshots:
        return alpha_1
    if not is_cyclic:
        return alpha_2
    previous = max([start, *(s for s in snapshots if s < step)])
    end = next((s for s in snapshots if s >= step), snapshots[-1])
    t = min((step - previous) / (end - previous), 1.0)
    return (1 - t) * alpha_1 + t * alpha_2


def swa_step(
    lr_at: Callable[[int], float], is_snapshot: Callable[[int], bool], average: RunningMean
) -> LocalStep:
    """A step at the lr of its place in the schedule; after a snapshot step the weights join ``average``."""
    steps = itertools.count(1)

    def step(model: nn.Module, batch: Batch, optimizer: Optimizer, backward: Backward) -> BatchLoss:
        step_num = next(steps)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step_num)
        loss = backward(batch)
        optimizer.step()
        if is_snapshot(step_num):
            average.add(P.model_params(model))  # RunningMean copies (to float64)
        return loss

    return step


class _Segments:
    """SWAD's dense averaging: every iterate joins the open segment, closed by a held-back loss."""

    def __init__(self, valley: LossValley, held_back_loss: Callable[[nn.Module], float]) -> None:
        self.valley, self.held_back_loss = valley, held_back_loss
        self.open, self.num_closed = RunningMean(), 0

    def add_iterate(self, model: nn.Module) -> None:
        self.open.add(P.model_params(model))  # RunningMean copies (to float64)

    def close(self, model: nn.Module) -> None:
        if self.open.count == 0:
            return
        loss = self.held_back_loss(model)
        self.valley.add(Segment(self.num_closed, self.open.mean(), int(self.open.count), loss))
        self.open, self.num_closed = RunningMean(), self.num_closed + 1


def swad_step(segments: _Segments, eval_every: int) -> LocalStep:
    """A step whose iterate joins the open segment; every ``eval_every`` steps the segment closes."""
    steps = itertools.count(1)

    def step(model: nn.Module, batch: Batch, optimizer: Optimizer, backward: Backward) -> BatchLoss:
        step_num = next(steps)
        loss = backward(batch)
        optimizer.step()
        segments.add_iterate(model)
        if step_num % eval_every == 0:
            segments.close(model)
        return loss

    return step


def upload(
    ctx: ClientContext[None, None],
    average: Params | None,
    recompute_bn: bool,
    data: ClientData,
    batch_size: int,
) -> Params:
    """Loads the average into the model (None: keeps its last weights), recomputes BatchNorm
    statistics there when asked, and returns ``delta = global - model``."""
    if average is not None:
        load_params(ctx.model, average)
    if recompute_bn:
        recompute_batchnorm(ctx.model, data, batch_size, ctx.device)
    return P.delta(ctx.global_params, P.model_params(ctx.model))


@register("algorithm", "swa")
class SWA:
    """SWA: FedAvg whose clients upload the average of snapshots along their local trajectory."""

    Config = SWAConfig

    def __init__(self, config: SWAConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        config = self.config
        total = planned_steps(len(ctx.data), config.local, ctx.round_num)
        snapshots = snapshot_steps(total, config.start_fraction, config.num_models)
        start = math.floor(config.start_fraction * total)
        alpha_1 = round_lr(config.local, ctx.round_num)
        alpha_2 = alpha_1 if config.swa_lr is None else config.swa_lr
        is_cyclic = config.lr_schedule == "cyclic"
        average = RunningMean()
        metrics = train_context(
            ctx,
            config.local,
            LocalHooks(
                step=swa_step(
                    lambda step: swa_lr(step, snapshots, start, alpha_1, alpha_2, is_cyclic),
                    set(snapshots).__contains__,
                    average,
                )
            ),
        )
        mean = average.mean() if average.count else None
        delta = upload(ctx, mean, config.recompute_bn, ctx.data, config.local.batch_size)
        metrics |= {"swa/snapshots": average.count}
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)


@register("algorithm", "swad")
class SWAD:
    """SWAD: FedAvg whose clients upload the dense mean of their iterates in a window held-back loss chose."""

    Config = SWADConfig

    def __init__(self, config: SWADConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        config = self.config
        train, held_back = hold_back_for_selection(ctx.data, config.selection_fraction, ctx.seed)
        valley = LossValley(config.start_window, config.end_window, config.tolerance)

        def held_back_loss(model: nn.Module) -> float:
            loss = evaluate(model, held_back, ctx.spec, ctx.device)["loss"]
            model.train()  # evaluate leaves the model in eval mode; training goes on
            return loss

        segments = _Segments(valley, held_back_loss)
        eval_every = config.eval_every or math.ceil(len(train) / config.local.batch_size)
        metrics = train_context(
            replace(ctx, data=train), config.local, LocalHooks(step=swad_step(segments, eval_every))
        )
        segments.close(ctx.model)  # the iterates since the last evaluation
        delta = upload(ctx, valley.finish(), config.recompute_bn, train, config.local.batch_size)
        metrics |= _window_metrics(valley, eval_every)
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)


def _window_metrics(valley: LossValley, eval_every: int) -> Metrics:
    """Where the window lay, in evaluations of ``eval_every`` steps: ``swad/start`` (0-based; 0 for
    a client that trained no step) and ``swad/segments`` (how many were averaged)."""
    start = float(valley.start) if valley.start is not None else 0.0
    return {
        "swad/start": start,
        "swad/segments": float(len(valley.averaged)),
        "swad/eval_every": float(eval_every),
    }
