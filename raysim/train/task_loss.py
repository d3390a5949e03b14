"""The task loss of a batch and a client's train metrics from its sums (``train_local``'s).

``task_loss`` is the loss every trainer takes unless a plugin replaces it: cross entropy for
classification and causal language modelling, mean squared error for regression, with the counts
for accuracy. ``outputs_loss`` is the same on outputs the model already produced (the vectorized
trainer's ``functional_call``, evaluation).

Usage:
    loss, correct, count = task_loss(model, batch, spec)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raysim.types import ClientMetrics, DataSpec

Batch = dict[str, torch.Tensor]


def task_loss(
    model: nn.Module, batch: Batch, spec: DataSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int]:
    """Mean loss over the batch, plus #correct and #predictions for accuracy.

    The counts stay tensors on the device: reading them every step would stall a GPU.
    """
    return outputs_loss(model(batch["x"]), batch, spec)


def outputs_loss(
    logits: torch.Tensor, batch: Batch, spec: DataSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int]:
    """``task_loss`` of outputs the model already produced on ``batch["x"]``."""
    x = batch["x"]
    if spec.task == "classification":
        y = batch["y"]
        loss = F.cross_entropy(logits, y)
        return loss, (logits.argmax(-1) == y).sum(), len(y)
    if spec.task == "regression":
        y = batch["y"].to(logits.dtype).reshape(logits.shape)
        return F.mse_loss(logits, y), torch.zeros((), device=logits.device), len(y)
    # causal LM: predict token t+1 from tokens <= t; padding is ignored. The targets are shifted
    # and padded with the ignored id, not the logits cut: slicing (B, T, V) logits and flattening
    # them copied the largest tensor of the step (5% of a small decoder's step on a CPU).
    ignore = spec.pad_token_id if spec.pad_token_id is not None else -100
    targets = F.pad(x[:, 1:], (0, 1), value=ignore)  # (B, T): the last position predicts nothing
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore)
    mask = targets != ignore
    return loss, ((logits.argmax(-1) == targets) & mask).sum(), mask.sum()


def train_metrics(
    loss_sum: torch.Tensor | float,
    correct: torch.Tensor | int,
    seen: torch.Tensor | int,
    num_batches: int,
    num_examples: int,
) -> ClientMetrics:
    """The client's means. On a GPU they stay 0-d tensors: the worker reads a round's clients
    back at once, so the card's queue is not drained between clients. Elsewhere read here."""
    counts = {"train/steps": float(num_batches), "train/num_examples": float(num_examples)}
    if isinstance(loss_sum, torch.Tensor) and loss_sum.device.type == "cuda":
        denominator = torch.as_tensor(seen, device=loss_sum.device).double().clamp(min=1.0)
        return {
            "train/loss": loss_sum.double() / denominator,
            "train/accuracy": torch.as_tensor(correct, device=loss_sum.device).double() / denominator,
            **counts,
        }
    mean = max(float(seen), 1.0)
    return {"train/loss": float(loss_sum) / mean, "train/accuracy": float(correct) / mean, **counts}
