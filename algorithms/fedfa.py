"""FedFA: feature anchors align the clients' features and calibrate their classifiers (Zhou, Zhang,
Tsang, "FedFA: Federated Learning with Feature Anchors to Align Features and Classifiers for
Heterogeneous Data", IEEE TMC 2023, arXiv:2211.09299).

The server keeps one feature anchor ``a_c`` per class (C, D), D the width of the head's input
``model.features(x)``, and broadcasts it with the model. On IMA's models with a linear projector
(``cnn_digit5``, ``vgg11`` and the ResNets with ``projector``) the features are the projector's
output (D = 128) and ``head`` the final classifier alone, as in the authors' code (TailinZhou/FedIMA,
``model.py``): the projector trains with the body and calibration leaves it alone. On every batch a client:
1. takes its optimizer step on ``CE(head(f(x)), y) + lambda * L_A``, the anchor loss pulling
   each feature to its class anchor, normalised as the authors' ``utils/AnchorLoss.py`` does:
   ``L_A = (1/C) sum_{c in batch} mean_{i: y_i = c} ||f(x_i) - a_c||^2``;
2. from ``calibrate_from`` on, calibrates the classifier: one Adam step (lr
   ``calibration_lr``, torch's default 1e-3, as the code) on ``model.head`` alone, on
   ``CE(head(a_c), c)`` over all C anchors;
3. keeps the batch's features (from step 1's forward pass, detached) for its anchor update.
At the end of each local epoch, for each class ``c`` the client saw in that epoch, its local
anchor moves to the class mean of that epoch's features: ``a_c <- m a_c + (1 - m) mean_c``,
``m = anchor_momentum`` (0.5; the IMA code uses 0.9 on Digit-Five and PACS). Classes it did not
see keep the global anchor. The server averages the deltas and the local anchors, both weighted by
examples (the IMA authors' reading, Zhou et al., IEEE TMC 2024, arXiv:2305.07845: "plain weighted
mean"), and steps with ``raysim.train.server_opt``.

Readings we chose (the paper text was not available; the code and the IMA authors'
baseline, Zhou et al., IEEE TMC 2024, arXiv:2305.07845, decide):
- the anchors start as C distinct standard basis vectors of R^D drawn from the run seed (C <= D),
  else as row-normalised Gaussian vectors (the code's ``AnchorLoss`` initialisation); D is read
  from the head's first linear layer, and clients build them in the first round from the seed,
  so every client starts from the same anchors;
- the class mean of an epoch is the mean over its examples. The code sums per-batch class means
  and divides by the number of batches in the epoch, which shrinks a class absent from some
  batches; we do not reproduce that;
- an epoch cut short by ``local.max_steps`` updates the anchors with what it saw.

Options for the IMA authors' setting (github TailinZhou/FedIMA, ``utils/optimizer.py``): they
calibrate from round ``> T/4`` (``calibrate_from: floor(T/4) + 1``, the true round index
even under IMA) and train round 0 without the anchor loss (``anchor_loss_from: 1``). The
FedFA repository's own code calibrates and pulls from round 0, our defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.batching import Batch
from raysim.train.local import (
    Backward,
    BatchLoss,
    LocalHooks,
    LocalTrainConfig,
    examples_trained_on,
    train_client,
)
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state
from raysim.types import (
    ClientContext,
    ClientResult,
    DataSpec,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
    feature_model,
    require_classification,
)


class FedFAConfig(BaseModel, frozen=True, extra="forbid"):
    """FedFA: anchor loss on the features, classifier calibration on the anchors, EMA anchors."""

    lambda_anchor: float = Field(0.1, ge=0)  # the code's; the paper picks from {0.1, 0.01, 0.001}
    anchor_momentum: float = Field(0.5, ge=0, lt=1)  # 0.9 for Digit-Five and PACS in the IMA code
    calibrate_from: int = Field(0, ge=0)  # the IMA setting: floor(num_rounds / 4) + 1
    calibration_lr: float = Field(1e-3, gt=0)  # Adam on the head alone
    anchor_loss_from: int = Field(0, ge=0)  # the IMA code: 1 (round 0 trains on CE alone)
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "its anchor loss and the class-mean features it uploads read the examples without noise"


@dataclass(frozen=True)
class FeatureAnchors:
    """The global class anchors (``ServerState.extra``)."""

    # older checkpoints also hold the run seed as anchor_seed: resuming ignores it (``stored.rebuild``)
    RETIRED_FIELDS: ClassVar[frozenset[str]] = frozenset({"anchor_seed"})

    anchors: torch.Tensor  # (C, D); empty until the first cohort reports (D is the workers')


@dataclass(frozen=True)
class AnchorPayload:
    """What every client receives beside the params (``Payload.extra``)."""

    anchors: torch.Tensor  # FeatureAnchors.anchors
    anchor_seed: int  # the run seed: draws the starting anchors (``initial_anchors``)


@dataclass(frozen=True)
class AnchoredDelta:
    """What a client sends; ``WeightedMean`` averages both fields (so the mean is one too)."""

    delta: Params  # global - local
    anchors: torch.Tensor  # (C, D) the client's updated anchors


def initial_anchors(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """The code's starting anchors (C, D): distinct standard basis vectors when C <= D, else
    Gaussian rows of unit norm; a pure function of ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    if num_classes <= dim:
        return torch.eye(dim)[torch.randperm(dim, generator=generator)[:num_classes]]
    return F.normalize(torch.randn(num_classes, dim, generator=generator), dim=1)


def anchor_loss(features: torch.Tensor, y: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """``(1/C) sum_{c in batch} mean_{i: y_i = c} ||f_i - a_c||^2``; features (B, D), anchors (C, D)."""
    num_classes = anchors.shape[0]
    distances = ((features - anchors[y]) ** 2).sum(dim=1)  # (B,)
    class_sizes = torch.bincount(y, minlength=num_classes)[y]  # (B,) examples of i's class in the batch
    return (distances / class_sizes).sum() / num_classes


def feature_dim(head: nn.Module) -> int:
    """D: the input width of the head's first linear layer."""
    linear = next((m for m in head.modules() if isinstance(m, nn.Linear)), None)
    if linear is None:
        raise TypeError(f"fedfa: the model's head has no linear layer to read D from: {head}")
    return linear.in_features


class AnchorStep:
    """The client's ``LocalStep`` with its ``loss_fn`` and ``extra_loss``: they share the batch's
    features, computed once per batch."""

    def __init__(
        self,
        anchors: torch.Tensor,
        config: FedFAConfig,
        head: nn.Module,
        *,
        calibrate: bool,
        batches_per_epoch: int,
    ) -> None:
        self.anchors = anchors  # the global anchors: fixed during the round
        self.local_anchors = anchors.clone()  # what the EMA moves
        self.config = config
        self.head = head
        self.calibration = (
            torch.optim.Adam(head.parameters(), lr=config.calibration_lr) if calibrate else None
        )
        self.batches_per_epoch = batches_per_epoch
        self._features = torch.empty(0)  # this batch's f(x), with its graph
        self._sums = torch.zeros_like(anchors)  # this epoch's feature sums per class
        self._counts = torch.zeros(anchors.shape[0], device=anchors.device)
        self._num_batches = 0

    def task_loss(self, model: nn.Module, batch: Batch, spec: DataSpec) -> BatchLoss:
        net = feature_model(model, "fedfa")
        self._features = net.features(batch["x"])  # (B, D)
        logits = net.head(self._features)
        y = batch["y"]
        return F.cross_entropy(logits, y), (logits.argmax(-1) == y).sum(), len(y)

    def weighted_anchor_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self.config.lambda_anchor * anchor_loss(self._features, batch["y"], self.anchors)

    def __call__(
        self, model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss:
        loss = backward(batch)
        optimizer.step()
        if self.calibration is not None:
            self._calibrate(self.calibration)
        self._record(self._features.detach(), batch["y"])
        return loss

    def finish(self) -> torch.Tensor:
        """The local anchors after training, folding in an epoch that ``max_steps`` cut short."""
        self._fold_epoch()
        return self.local_anchors

    def _calibrate(self, optimizer: torch.optim.Optimizer) -> None:
        classes = torch.arange(self.anchors.shape[0], device=self.anchors.device)
        loss = F.cross_entropy(self.head(self.anchors), classes)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def _record(self, features: torch.Tensor, y: torch.Tensor) -> None:
        self._sums.index_add_(0, y, features.to(self._sums.dtype))
        self._counts.index_add_(0, y, torch.ones_like(y, dtype=self._counts.dtype))
        self._num_batches += 1
        if self._num_batches % self.batches_per_epoch == 0:
            self._fold_epoch()

    def _fold_epoch(self) -> None:
        seen = self._counts > 0
        means = self._sums[seen] / self._counts[seen, None]
        m = self.config.anchor_momentum
        self.local_anchors[seen] = m * self.local_anchors[seen] + (1 - m) * means
        self._sums.zero_()
        self._counts.zero_()


@register("algorithm", "fedfa")
class FedFA:
    """FedFA: FedAvg whose clients align features to class anchors and calibrate on them."""

    Config = FedFAConfig

    def __init__(self, config: FedFAConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[FeatureAnchors]:
        require_classification(info, "algorithm fedfa", "it keeps one feature anchor per class")
        # D is known to the workers only (from the model): the first cohort builds the anchors
        return init_state(params, info, FeatureAnchors(torch.zeros(0)))

    def payload(
        self, state: ServerState[FeatureAnchors], round_num: int, info: RunInfo
    ) -> Payload[AnchorPayload]:
        extra = AnchorPayload(state.extra.anchors, info.seed)
        return Payload(P.to_numpy(state.params), extra=P.numpy_leaves(extra))

    def client_update(self, ctx: ClientContext[AnchorPayload, None]) -> ClientResult[AnchoredDelta, None]:
        head = feature_model(ctx.model, "fedfa").head
        anchors = ctx.payload.extra.anchors
        if anchors.numel() == 0:
            anchors = initial_anchors(ctx.spec.num_classes, feature_dim(head), ctx.payload.extra.anchor_seed)
        config = self.config
        step = AnchorStep(
            anchors.to(ctx.device, torch.float32),
            config,
            head,
            calibrate=ctx.round_num >= config.calibrate_from,
            batches_per_epoch=max(math.ceil(len(ctx.data) / config.local.batch_size), 1),
        )
        pulls = ctx.round_num >= config.anchor_loss_from
        delta, metrics = train_client(
            ctx,
            config.local,
            LocalHooks(
                loss_fn=step.task_loss, extra_loss=step.weighted_anchor_loss if pulls else None, step=step
            ),
        )
        return ClientResult(AnchoredDelta(delta, step.finish()), examples_trained_on(metrics), metrics)

    def aggregator(self) -> WeightedMean[AnchoredDelta]:
        return WeightedMean(weighted=self.config.weighted)

    def pseudo_gradient(self, mean: AnchoredDelta) -> Params:
        return mean.delta

    def server_update(
        self, state: ServerState[FeatureAnchors], mean: AnchoredDelta | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[FeatureAnchors], Metrics]:
        if mean is None:
            return state, {}
        state, metrics = apply_server_step(state, mean.delta, self.config.server)
        return replace(state, extra=replace(state.extra, anchors=mean.anchors.cpu())), metrics
