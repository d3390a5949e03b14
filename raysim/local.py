"""The shared local trainer and evaluator that every plugin builds on.

Plugins vary local training through hooks rather than subclassing: ``extra_loss(model, batch)``
adds a term to the task loss (FedGuCci's connectivity loss), ``after_backward(model)`` edits
gradients before the step (SCAFFOLD's control-variate correction, FedProx's proximal gradient)
and ``loss_fn(model, batch, spec)`` replaces the task loss (logit calibration). A plugin that
needs its own step (SAM) writes its loop from ``iterate_batches`` and ``task_loss``.

Usage:
    metrics = train_local(model, data, LocalTrainConfig(lr=0.1), seed=7, spec=spec)
    result = local_delta_update(ctx, config)           # the FedAvg client in one call
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from raysim import params as P
from raysim.types import ClientContext, ClientData, ClientResult, DataSpec, Metrics

Batch = dict[str, torch.Tensor]
ExtraLoss = Callable[[nn.Module, Batch], torch.Tensor]
AfterBackward = Callable[[nn.Module], None]
LossFn = Callable[[nn.Module, Batch, DataSpec], tuple[torch.Tensor, int, int]]


class LocalTrainConfig(BaseModel, frozen=True, extra="forbid"):
    """Client-side training hyper-parameters."""

    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0)
    lr_decay: float = Field(1.0, gt=0, le=1)  # round r trains at lr * lr_decay**r
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    optimizer: str = Field("sgd", pattern="^(sgd|adam)$")
    max_steps: int | None = Field(None, ge=1)  # stop after this many local steps
    grad_clip: float | None = Field(None, gt=0)  # max global grad norm


def to_tensors(data: ClientData, device: torch.device | str = "cpu") -> Batch:
    """Moves a client's arrays to ``device`` once; batches are then index views."""
    # Arrays read from a memory map are read-only; torch needs writable memory.
    return {k: torch.from_numpy(np.require(v, requirements="W")).to(device) for k, v in data.arrays.items()}


def iterate_batches(
    tensors: Batch, batch_size: int, generator: torch.Generator | None = None
) -> Iterator[Batch]:
    """Yields batches, shuffled when ``generator`` is given."""
    first = next(iter(tensors.values()))
    n = len(first)
    # drawn on the CPU (the generator decides), moved to the device once per pass
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    order = order.to(first.device)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        yield {k: v[idx] for k, v in tensors.items()}


def cap_examples(data: ClientData, max_examples: int | None, seed: int) -> ClientData:
    """The client's examples this round: all, or one seeded random subset of ``max_examples``.

    The engine applies it (``engine.max_client_examples``) before ``client_update`` and before
    measuring the client-server barrier; a pure function of ``seed``.
    """
    if max_examples is None or len(data) <= max_examples:
        return data
    keep = np.sort(np.random.default_rng([seed, 0x5EED]).permutation(len(data))[:max_examples])
    return ClientData({k: v[keep] for k, v in data.arrays.items()})


def round_lr(config: LocalTrainConfig, round_num: int) -> float:
    """The local learning rate in ``round_num`` (exponential decay per round)."""
    return config.lr * config.lr_decay**round_num


def task_loss(
    model: nn.Module, batch: Batch, spec: DataSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int]:
    """Mean loss over the batch, plus #correct and #predictions for accuracy.

    The counts stay tensors on the device: reading them every step would stall a GPU.
    """
    x = batch["x"]
    logits = model(x)
    if spec.task == "classification":
        y = batch["y"]
        loss = F.cross_entropy(logits, y)
        return loss, (logits.argmax(-1) == y).sum(), len(y)
    if spec.task == "regression":
        y = batch["y"].to(logits.dtype).reshape(logits.shape)
        return F.mse_loss(logits, y), torch.zeros((), device=logits.device), len(y)
    # causal LM: predict token t+1 from tokens <= t; padding is ignored.
    targets = x[:, 1:]
    logits = logits[:, :-1]  # (B, T-1, V)
    ignore = spec.pad_token_id if spec.pad_token_id is not None else -100
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore)
    mask = targets != ignore
    return loss, ((logits.argmax(-1) == targets) & mask).sum(), mask.sum()


def make_optimizer(model: nn.Module, config: LocalTrainConfig, lr: float) -> torch.optim.Optimizer:
    trainable = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        return torch.optim.Adam(trainable, lr=lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(trainable, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay)


def train_local(
    model: nn.Module,
    data: ClientData,
    config: LocalTrainConfig,
    *,
    seed: int,
    spec: DataSpec,
    device: torch.device | str = "cpu",
    round_num: int = 0,
    extra_loss: ExtraLoss | None = None,
    after_backward: AfterBackward | None = None,
    loss_fn: LossFn | None = None,
) -> Metrics:
    """Trains ``model`` in place on one client's data; returns train metrics.

    Shuffling is drawn from ``seed`` alone, so a client's training does not depend on which
    worker runs it or what ran before.
    """
    model.train()
    optimizer = make_optimizer(model, config, round_lr(config, round_num))
    tensors = to_tensors(data, device)
    generator = torch.Generator().manual_seed(seed)
    compute_loss = loss_fn or task_loss
    loss_sum, correct, seen, steps = 0.0, 0, 0, 0
    for _ in range(config.epochs):
        for batch in iterate_batches(tensors, config.batch_size, generator):
            loss, num_correct, num_items = compute_loss(model, batch, spec)
            total = loss + extra_loss(model, batch) if extra_loss is not None else loss
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            if after_backward is not None:
                after_backward(model)
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            loss_sum = loss_sum + loss.detach() * num_items
            correct, seen, steps = correct + num_correct, seen + num_items, steps + 1
            if config.max_steps is not None and steps >= config.max_steps:
                return _train_metrics(loss_sum, correct, seen, steps)
    return _train_metrics(loss_sum, correct, seen, steps)


def _train_metrics(
    loss_sum: torch.Tensor | float, correct: torch.Tensor | int, seen: torch.Tensor | int, steps: int
) -> Metrics:
    """Reads the device counters once, at the end of the client."""
    seen = max(float(seen), 1.0)
    return {
        "train/loss": float(loss_sum) / seen,
        "train/accuracy": float(correct) / seen,
        "train/steps": float(steps),
    }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ClientData,
    spec: DataSpec,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> Metrics:
    """Loss and accuracy of ``model`` on ``data`` (accuracy per token for causal LM)."""
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for batch in iterate_batches(to_tensors(data, device), batch_size):
        loss, num_correct, num_items = task_loss(model, batch, spec)
        loss_sum, correct, seen = loss_sum + loss * num_items, correct + num_correct, seen + num_items
    seen = float(seen)
    metrics = {
        "loss": float(loss_sum) / max(seen, 1.0),
        "accuracy": float(correct) / max(seen, 1.0),
        "num_examples": seen,
    }
    if spec.task == "causal_lm":  # per-token cross-entropy is log-perplexity (nats)
        metrics["perplexity"] = math.exp(min(metrics["loss"], 50.0))
    return metrics


def local_delta_update(
    ctx: ClientContext,
    config: LocalTrainConfig,
    *,
    extra_loss: ExtraLoss | None = None,
    after_backward: AfterBackward | None = None,
) -> ClientResult:
    """The FedAvg-family client: train locally, send ``global - local`` weighted by #examples."""
    metrics = train_local(
        ctx.model,
        ctx.data,
        config,
        seed=ctx.seed,
        spec=ctx.spec,
        device=ctx.device,
        round_num=ctx.round_num,
        extra_loss=extra_loss,
        after_backward=after_backward,
    )
    update = P.delta(ctx.global_params, P.model_params(ctx.model))
    return ClientResult(update, float(len(ctx.data)), metrics)
