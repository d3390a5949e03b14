"""Task losses that replace ``train_local``'s cross-entropy (its ``loss_fn`` hook).

FedLC logit calibration (Zhang et al., "Federated Learning with Label Distribution Skew via
Logits Calibration", ICML 2022, arXiv:2209.00189), as FedGuCci+ and the authors' FedLC baseline
use it (Li et al., KDD 2025, arXiv:2402.18949): each logit is lowered by a margin
that shrinks with how often the client has seen its class,

    z'_c = z_c - strength * n_c^(-1/4),    loss = CE(softmax(z'), y),

(``strength`` is the paper's tau) with n_c the count of class c in the client's training labels.
Rare classes lose more, which counters the bias of a label-skewed client towards its frequent
classes. A class the client never
saw (n_c = 0) gets z'_c = -inf: it drops out of the softmax (the code's 0^(-1/4) = inf, written
as an explicit mask). With equal counts the shift is the same for every class, and CE is unchanged.
Plugins take it as one option, ``logit_calibration: {strength: 0.1}`` (``LogitCalibrationConfig``;
``null`` where it is optional).

The balanced softmax (Ren et al., "Balanced Meta-Softmax for Long-Tailed Visual Recognition",
NeurIPS 2020, arXiv:2007.10740; FedRoD's balanced risk, Chen & Chao, ICLR 2022,
arXiv:2107.00778) adds ``log n_c`` to the logits instead: ``loss = CE(softmax(z + log n), y)``.

Accuracy counts the raw logits' argmax: the calibration is a training device, and evaluation
(``raysim.measure.evaluate.evaluate``) scores the uncalibrated model, so the train accuracy stays comparable
with the test accuracy (and with FedAvg's).

Usage:
    loss_fn = fedlc_loss(ctx, strength=0.1)                    # counts from ctx.data's labels
    metrics = train_local(model, data, config, seed=s, spec=spec, hooks=LocalHooks(loss_fn=loss_fn))
    logits = torch.func.functional_call(model, weights, (x,))  # or at any weights:
    loss = F.cross_entropy(calibrate_logits(logits, counts, strength=0.1), y)
    loss = balanced_softmax_loss(logits, y, client_label_counts(ctx.data, num_classes))
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from raysim.train.batching import Batch
from raysim.train.local import BatchLoss, LossFn
from raysim.types import ClientContext, ClientData, DataSpec


class LogitCalibrationConfig(BaseModel, frozen=True, extra="forbid"):
    """FedLC's logit calibration, the same in every plugin that offers it (fedlc, fedgucci)."""

    # z_c - strength * n_c^(-1/4), the paper's tau; FedLC and FedGuCci+ use 0.1
    strength: float = Field(0.1, ge=0)


def label_counts(labels: np.ndarray | torch.Tensor, num_classes: int) -> torch.Tensor:
    """How many examples of each class ``labels`` holds: a float (num_classes,) tensor.

    Raises:
        ValueError: a label lies outside ``[0, num_classes)``.
    """
    labels = torch.as_tensor(labels).long().reshape(-1)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"label_counts: labels must lie in [0, {num_classes}), got "
            f"[{int(labels.min())}, {int(labels.max())}]; check the dataset's num_classes"
        )
    return torch.bincount(labels, minlength=num_classes).float()


def client_label_counts(data: ClientData, num_classes: int) -> torch.Tensor:
    """``label_counts`` of a client's labels ``data.arrays["y"]`` (zeros when it has no data)."""
    return label_counts(data.arrays.get("y", np.zeros(0, np.int64)), num_classes)


def calibrate_logits(logits: torch.Tensor, counts: torch.Tensor, strength: float) -> torch.Tensor:
    """FedLC's calibrated logits ``z_c - strength * n_c^(-1/4)``; ``-inf`` where ``n_c = 0``.

    Works on any (..., C) logits, e.g. those of ``torch.func.functional_call`` at interpolated
    weights (FedGuCci+); ``counts`` is (C,) and should already be on the logits' device.
    """
    counts = counts.to(logits.dtype)
    seen = counts > 0
    margin = strength * torch.where(seen, counts, torch.ones_like(counts)) ** -0.25
    return torch.where(seen, logits - margin, torch.full_like(logits, -torch.inf))


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``softmax(logits + log counts)``: the balanced softmax (Ren et al.,
    NeurIPS 2020), FedRoD's balanced risk for the generic model. logits (B, C), counts (C,).

    A class with count 0 gets ``log 0 = -inf``: probability 0 and no gradient.
    """
    return F.cross_entropy(logits + counts.log(), y)


def logit_calibrated_loss(counts: torch.Tensor, strength: float) -> LossFn:
    """A ``LossFn``: cross-entropy of the calibrated logits; accuracy from the raw logits.

    Args:
        counts: (num_classes,) class counts of the client's training labels (``label_counts``),
            on the device the model runs on.
        strength: the calibration strength (FedLC and FedGuCci+ use 0.1).
    """
    if strength < 0:
        raise ValueError(f"logit calibration: strength must be >= 0, got {strength}")

    def loss_fn(model: nn.Module, batch: Batch, spec: DataSpec) -> BatchLoss:
        if spec.task != "classification":
            raise ValueError(f"logit calibration needs a classification task, not {spec.task!r}")
        logits, y = model(batch["x"]), batch["y"]
        loss = F.cross_entropy(calibrate_logits(logits, counts, strength), y)
        return loss, (logits.argmax(-1) == y).sum(), len(y)

    return loss_fn


def fedlc_loss(ctx: ClientContext, strength: float) -> LossFn:
    """``logit_calibrated_loss`` with the counts of this client's training labels (``ctx.data``),
    computed once per client and moved to ``ctx.device``.

    Raises:
        ValueError: the task is not classification (there are no classes to count).
    """
    if ctx.spec.task != "classification":
        raise ValueError(f"logit calibration (FedLC) needs a classification task, not {ctx.spec.task!r}")
    return logit_calibrated_loss(client_label_counts(ctx.data, ctx.spec.num_classes).to(ctx.device), strength)
