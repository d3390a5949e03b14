"""FedGuCci and FedGuCci+: local models kept linearly connected to recent global models.

Zexi Li, Jie Lin, Zhiqi Li, Didi Zhu, Tao Shen, Tao Lin, Chao Wu, Nicholas D. Lane, "FedGuCci:
Making Local Models More Connected in Landscape for Federated Learning", KDD 2025,
arXiv:2402.18949 (the FedGuCci paper), and the authors' code (github.com/ZexiLee/fedgucci); user
guide: docs/fedgucci.md.

Client (FedGuCci paper, Sec. 4.1, Eq. 7-8 and 12-13). With anchors a_1..a_n (the n = min(N, t+1)
newest global models, newest first, the round's own starting model included), each client
minimises (Eq. 13, the code's 1/n)

    l(w) + (beta / n) * sum_j l(alpha_j w + (1 - alpha_j) a_j)

on the same mini-batch. The interpolated terms run through ``torch.func.functional_call`` on
``alpha w + (1 - alpha) a.detach()`` over the trainable parameters, so autograd gives the live weights
``alpha * grad l(m_j)`` and the anchors nothing. The terms are written once, as a ``ClientChange``'s
passes, for the sequential and the vectorized trainer. ``update_mode``:
- ``sequential`` (default, the authors' code): per batch one optimizer step on the
  task loss, then one step per anchor (newest first) on that anchor's term at the already
  updated weights: 1 + n steps, each with momentum and weight decay.
- ``joint`` (Eq. 13 as written): one loss, one backward pass, one step.
``alpha_mode``: ``fixed`` (alpha = 0.5, the code) or ``uniform`` (alpha_j ~ U(0, 1) per batch and
anchor, the cited learning-lines works; Eq. 7).

FedGuCci+ (FedGuCci paper, Sec. 4.2) = FedGuCci with ``logit_calibration: {strength: 0.1}`` (FedLC's
calibrated cross-entropy, ``raysim.train.losses``, replaces the task loss in every term) and ``sam:
{rho: 0.05}`` (``raysim.train.sharpness.sam_descend`` takes every step, the task step and each
connectivity step; in joint mode, the one step; ``adaptive: true`` makes it ASAM). ``null`` switches
either off.

Server: FedAvg (any ``raysim.train.server_opt`` optimizer), weighted by the examples trained on; it
then pushes the new global model onto ``ServerState.extra.anchors`` (a list of the newest N
models' trainable tensors, newest first). The broadcast's params are anchor 1; only the older
anchors travel in ``payload.extra.anchors``, so the engine counts them apart as
``sys/bytes_down/anchors``, so that the paper's no-extra-communication claim can be checked.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

import numpy as np
import torch
from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.checkpoint import CheckpointTrail
from raysim.errors import CheckpointError
from raysim.registry import register
from raysim.stored import from_plain, plain
from raysim.train.batching import Batch
from raysim.train.client_change import (
    BatchLoss,
    ClientChange,
    Draws,
    Losses,
    Pass,
    PerClient,
    TaskLoss,
    Weights,
    task_pass,
)
from raysim.train.local import (
    Backward,
    LocalHooks,
    LocalStep,
    LocalTrainConfig,
    examples_trained_on,
    train_client,
)
from raysim.train.losses import LogitCalibrationConfig, fedlc_loss
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state
from raysim.train.sharpness import SamConfig, sam_descend, sam_step
from raysim.train.vectorized import train_clients
from raysim.types import (
    ClientContext,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
    require_classification,
)

Result: TypeAlias = ClientResult[Params, None]  # what a client sends


class FedGuCciConfig(BaseModel, frozen=True, extra="forbid"):
    """FedGuCci: FedAvg whose clients stay linearly connected to recent global models (Li et al. 2025)."""

    num_anchors: int = Field(1, ge=1)  # N, the current global model included (code default 1)
    beta: float = Field(0.1, ge=0)  # weight of the connectivity loss (code default)
    # the interpolation point when alpha_mode is fixed; None means the code's 0.5. Optional so
    # that to_dict's full dump (alpha: null) of a uniform config validates again on the workers.
    alpha: float | None = Field(None, ge=0, le=1)
    alpha_mode: Literal["fixed", "uniform"] = "fixed"
    update_mode: Literal["sequential", "joint"] = "sequential"
    # train: the interpolated pass in train mode with the live model's buffers (BN statistics it
    # would update are discarded); eval: the authors' code's quirk, eval mode with the
    # round's global buffers (no dropout, BN normalises with the global running statistics).
    interpolated_mode: Literal["train", "eval"] = "train"
    logit_calibration: LogitCalibrationConfig | None = None  # FedLC's CE as the task loss (FedGuCci+)
    sam: SamConfig | None = None  # SAM (or ASAM) on every step (FedGuCci+)
    # paper: SAM steps on the perturbed gradient; fedgucci_code: the code's SAM connectivity steps
    # on the clean plus the perturbed gradient (the authors' code)
    reading: Literal["paper", "fedgucci_code"] = "paper"
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()  # SGD lr 1 == FedAvg
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        sam = ", with SAM," if self.sam is not None else ","  # FedGuCci+'s second gradient too
        return (
            f"it steps once per anchor on every batch{sam} and the accountant counts one gradient per batch"
        )

    @field_validator("logit_calibration", "sam", mode="before")
    @classmethod
    def _settings_not_a_switch(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool):
            example = "{strength: 0.1}" if info.field_name == "logit_calibration" else "{rho: 0.05}"
            raise ValueError(
                f"{info.field_name} takes its settings, e.g. {info.field_name}: {example}, or null for off; "
                f"not {str(value).lower()}"
            )
        return value

    @model_validator(mode="after")
    def _options_that_apply(self) -> "FedGuCciConfig":
        if self.alpha_mode == "uniform" and self.alpha is not None:
            raise ValueError(
                "alpha is drawn from U(0, 1) when alpha_mode is uniform: drop alpha, or set alpha_mode: fixed"
            )
        if self.reading == "fedgucci_code" and not (self.sam and self.update_mode == "sequential"):
            raise ValueError(
                "reading fedgucci_code reproduces the code's SAM gradient sum in sequential connectivity "
                "steps: it needs sam set (e.g. sam: {rho: 0.05}) and update_mode: sequential"
            )
        return self

    @property
    def fixed_alpha(self) -> float | None:
        """The interpolation point of every term, or None when alpha_mode draws it per batch."""
        if self.alpha_mode == "uniform":
            return None
        return 0.5 if self.alpha is None else self.alpha


class FedGuCciPlusConfig(FedGuCciConfig, frozen=True):
    """FedGuCci+: FedGuCci with FedLC logit calibration and SAM on every step (Li et al. 2025)."""

    logit_calibration: LogitCalibrationConfig | None = LogitCalibrationConfig()
    sam: SamConfig | None = SamConfig()


class Connectivity:
    """One client's connectivity terms ``(beta / n) * l(alpha_j w + (1 - alpha_j) a_j)``, as passes.

    A pass sees the client's weights and buffers and the task loss ``task`` at any weights (the
    trainer's: FedLC's calibrated loss in FedGuCci+); the alphas reach it as the batch's draws.

    Args:
        model: the client's (resident) model, whose mode the eval-mode pass switches.
        anchors: the n anchors' trainable tensors, newest first, on the model's device.
        beta: the weight of the whole connectivity loss (shared by the n terms).
        alpha: the fixed interpolation coefficient, or None to draw alpha_j ~ U(0, 1) at every
            ``redraw`` (once per batch).
        rng: where uniform alphas come from.
        eval_buffers: None for the interpolated pass in train mode with (copies of) the client's
            buffers; else run it in eval mode with these buffers (the code's quirk).
    """

    def __init__(
        self,
        model: nn.Module,
        anchors: list[Params],
        beta: float,
        alpha: float | None,
        rng: np.random.Generator,
        eval_buffers: Params | None = None,
    ) -> None:
        self.model, self.anchors, self.beta, self.alpha = model, anchors, beta, alpha
        self.rng, self.eval_buffers = rng, eval_buffers
        self.alphas = [alpha if alpha is not None else 0.5] * len(anchors)
        self.redraw()

    def redraw(self) -> list[float]:
        """New alphas for the next batch (uniform mode only; fixed ones never change); returns them."""
        if self.alpha is None:
            self.alphas = self.rng.uniform(0.0, 1.0, size=len(self.anchors)).tolist()
        return self.alphas

    def change(self, update_mode: Literal["sequential", "joint"]) -> ClientChange:
        """The change: a task step then one step per anchor (``sequential``), or Eq. 13's one joint
        step; every client shares it (the anchors, beta and buffers are the round's)."""
        terms = tuple(self.term(j) for j in range(len(self.anchors)))
        passes = (task_pass, *terms) if update_mode == "sequential" else (self.joint,)
        return ClientChange(passes=passes)

    def per_client(self) -> PerClient:
        """The client's own alpha stream, drawn once per batch."""
        return PerClient(draw=self.redraw)

    def term(self, j: int) -> Pass:
        """Anchor ``j``'s term: a connectivity step's objective (sequential)."""
        scale = self.beta / len(self.anchors)

        def term(task: TaskLoss, weights: Weights, buffers: Weights, draws: Draws) -> Losses:
            losses = self.interpolated_loss(task, weights, buffers, draws, j)
            return losses[0] * scale, losses

        return term

    def joint(self, task: TaskLoss, weights: Weights, buffers: Weights, draws: Draws) -> Losses:
        """Eq. 13: the task loss plus all terms (joint)."""
        total, losses = task_pass(task, weights, buffers, draws)
        terms = [
            self.interpolated_loss(task, weights, buffers, draws, j)[0] for j in range(len(self.anchors))
        ]
        return total + torch.stack(terms).sum() * (self.beta / len(self.anchors)), losses

    def interpolated_loss(
        self, task: TaskLoss, weights: Weights, buffers: Weights, draws: Draws, j: int
    ) -> BatchLoss:
        """The task loss at ``alpha_j w + (1 - alpha_j) a_j``; the gradient reaches w only."""
        alpha, anchor = draws[j], self.anchors[j]
        mixed = {name: alpha * p + (1.0 - alpha) * anchor[name].detach() for name, p in weights.items()}
        if self.eval_buffers is None:  # copies: the statistics this pass would update are dropped
            return task(mixed, {name: b.clone() for name, b in buffers.items()})
        was_training = self.model.training
        self.model.eval()
        try:
            return task(mixed, self.eval_buffers)
        finally:
            self.model.train(was_training)


def sam_steps(sam: SamConfig | None, num_passes: int, add_clean_gradient: bool) -> LocalStep | None:
    """How each pass takes its step: SAM's (or a plain one when ``sam`` is None). With
    ``add_clean_gradient`` (``reading: fedgucci_code``, the authors' code) the connectivity steps,
    every batch's passes after its first, step on the clean plus the perturbed gradient."""
    if sam is None:
        return None
    if not add_clean_gradient:
        return sam_step(**sam.model_dump())
    passes = itertools.count()

    def step(
        model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss:
        connectivity = next(passes) % num_passes > 0
        return sam_descend(model, batch, optimizer, backward, sam, add_clean_gradient=connectivity)

    return step


@dataclass(frozen=True)
class Anchors:
    """The server's anchors, newest first (``ServerState.extra``); the payload carries all but
    the newest, which is the broadcast itself (numpy arrays when sent, tensors on ``ctx.device``
    in ``client_update``)."""

    anchors: list[Params]  # in the payload: tensors on ``ctx.device`` (numpy arrays on the way)


@register("algorithm", "fedgucci", config=FedGuCciConfig)
@register("algorithm", "fedgucci_plus", config=FedGuCciPlusConfig)
class FedGuCci:
    """FedGuCci(+): FedAvg plus a connectivity loss towards the N newest global models."""

    Config = FedGuCciConfig
    UPDATE_DELTA = ""  # compression encodes the update, a parameter delta

    def __init__(self, config: FedGuCciConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[Anchors]:
        if self.config.logit_calibration is not None:
            why = "FedLC calibrates class logits; set logit_calibration: null (or use fedgucci)"
            require_classification(info, "algorithm.logit_calibration", why)
        anchor = _trainable(P.clone(params), info.buffer_keys)
        return init_state(params, info, Anchors([anchor]))

    def resume_state(
        self, saved: ServerState[Any], fresh: ServerState[Anchors], trail: CheckpointTrail
    ) -> ServerState[Anchors]:
        """A FedGuCci checkpoint keeps its anchors (the newest ``num_anchors`` of them). Another
        run's (FedAvg's, with no plugin state) gets the parent's global models of its last N
        rounds, newest first, read from the checkpoints beside the given one; a parent younger
        than N rounds adds this run's initial model, as a run from round 0 would (the parent's
        own with the same seed)."""
        kept = plain(saved.extra)  # the dict of Anchors' fields, as the checkpoint holds it
        if kept:
            anchors = from_plain(Anchors, kept, f"{trail.path}'s server state").anchors
        else:
            anchors = self._parent_anchors(trail, saved.buffer_keys, initial=fresh.extra.anchors[-1])
        return replace(saved, extra=Anchors(anchors[: self.config.num_anchors]))

    def _parent_anchors(
        self, trail: CheckpointTrail, buffer_keys: frozenset[str], initial: Params
    ) -> list[Params]:
        last, n = trail.last_round, self.config.num_anchors
        rounds = range(last, max(-1, last - n), -1)  # newest first
        try:
            anchors = [_trainable(trail.state_after(r).params, buffer_keys) for r in rounds]
        except CheckpointError as exc:
            raise CheckpointError(
                f"FedGuCci with num_anchors: {n} takes the parent's global models of rounds "
                f"{rounds[-1]} to {last} as its anchors: {exc}; run the parent with "
                f"engine.checkpoint_every: 1 (its checkpoints of the {n} rounds before the branch "
                f"are what FedGuCci needs), or set num_anchors: 1"
            ) from exc
        if len(anchors) < n:  # the parent ran fewer than N rounds: a run from round 0 keeps its start
            anchors.append(initial)
        return anchors

    def payload(self, state: ServerState[Anchors], round_num: int, info: RunInfo) -> Payload[Anchors]:
        older = Anchors(state.extra.anchors[1:])  # anchor 1 is the params
        return Payload(P.to_numpy(state.params), extra=P.numpy_leaves(older))

    def client_update(self, ctx: ClientContext[Anchors, None]) -> ClientResult[Params, None]:
        config = self.config
        calibration = config.logit_calibration
        connectivity = self._connectivity(ctx)
        change, client = connectivity.change(config.update_mode), connectivity.per_client()
        step = sam_steps(config.sam, len(change.passes), add_clean_gradient=config.reading == "fedgucci_code")
        task = fedlc_loss(ctx, calibration.strength) if calibration is not None else None
        delta, metrics = train_client(
            ctx, config.local, LocalHooks(change=change, client=client, loss_fn=task, step=step)
        )
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    @property
    def vectorized_update(self) -> Callable[[list[ClientContext[Anchors, None]]], list[Result]] | None:
        """``client_update`` for a chunk; None with SAM or logit calibration, which do not vectorize."""
        plain = self.config.sam is None and self.config.logit_calibration is None
        return self._vectorized_update if plain else None

    def _vectorized_update(self, ctxs: list[ClientContext[Anchors, None]]) -> list[Result]:
        change = self._connectivity(ctxs[0]).change(self.config.update_mode)  # the round's: shared
        trained = train_clients(ctxs, self.config.local, change=change, client=self.per_client)
        return [ClientResult(delta, examples_trained_on(metrics), metrics) for delta, metrics in trained]

    def per_client(self, ctx: ClientContext[Anchors, None]) -> PerClient:
        """The client's own alpha stream."""
        return self._connectivity(ctx).per_client()

    def _connectivity(self, ctx: ClientContext[Anchors, None]) -> Connectivity:
        config = self.config
        trainable = {name: p for name, p in ctx.model.named_parameters() if p.requires_grad}
        older = ctx.payload.extra.anchors  # tensors on ctx.device already
        anchors = [
            {name: anchor[name].to(p.dtype) for name, p in trainable.items()}
            for anchor in [ctx.global_params, *older]
        ]
        eval_buffers = None
        if config.interpolated_mode == "eval":
            floats = {name for name, b in ctx.model.named_buffers() if b.is_floating_point()}
            eval_buffers = {name: v for name, v in ctx.global_params.items() if name in floats}
        return Connectivity(
            ctx.model,
            anchors,
            config.beta,
            config.fixed_alpha,
            np.random.default_rng([ctx.seed, 0xA1FA]),  # alphas apart from the shuffling stream
            eval_buffers,
        )

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[Anchors], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[Anchors], Metrics]:
        """FedAvg, then the new global model becomes anchor 1 (also when nobody reported: the
        code pushes the global model at every round's start)."""
        state, metrics = apply_server_step(state, mean_delta, self.config.server)
        newest = _trainable(P.clone(state.params), state.buffer_keys)
        anchors = [newest, *state.extra.anchors][: self.config.num_anchors]
        return replace(state, extra=Anchors(anchors)), metrics


def _trainable(params: Params, buffer_keys: frozenset[str]) -> Params:
    """The tensors an anchor keeps: the trainable parameters, not the float buffers."""
    return {k: v for k, v in params.items() if k not in buffer_keys}
