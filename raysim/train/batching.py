"""How a client's shuffled examples form training batches when the model has BatchNorm.

BatchNorm in train mode normalises a batch by its own statistics, which one example cannot give
(torch refuses it outright after a 1x1 feature map: "Expected more than 1 value per channel when
training"). So, for a model with a BatchNorm layer in train mode:

- an epoch's last batch of one example is merged into the batch before it (``batch_size + 1``
  examples): every example still trains every epoch, the shuffling is unchanged, and the epoch
  takes one step fewer. A model without BatchNorm keeps its short last batch as it is.
- a client with one example in all trains on it with its BatchNorm layers in eval mode: they
  normalise by their running statistics and leave them as they were (``lone_example``).

``train_local`` and ``train_local_vectorized`` both form batches here, so the two agree.

Usage:
    for idx in epoch_batches(order, batch_size, merge_lone=has_batchnorm(model)): ...
    with lone_example(model, len(batch["y"])): loss = step(...)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

S = TypeVar("S", bound=Callable[..., object])


def batchnorm_layers(model: nn.Module) -> list[_BatchNorm]:
    """The model's BatchNorm layers in train mode (those that normalise by the batch)."""
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.training]


def has_batchnorm(model: nn.Module) -> bool:
    """Whether a batch of one example would reach a BatchNorm layer in train mode."""
    return bool(batchnorm_layers(model))


def epoch_batches(order: torch.Tensor, batch_size: int, *, merge_lone: bool) -> list[torch.Tensor]:
    """One epoch's batches as index tensors of ``order``, ``batch_size`` each, the last short;
    with ``merge_lone`` a last batch of one joins the batch before it."""
    batches = list(order.split(batch_size)) if len(order) else []  # no data: no batch, not an empty one
    if merge_lone and len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2:] = [torch.cat(batches[-2:])]
    return batches


def batch_plan(
    n: int, batch_size: int, epochs: int, limit: int | None, seed: int, *, merge_lone: bool
) -> list[torch.Tensor]:
    """A client's batches as index tensors, in ``train_local``'s order: one ``randperm`` per epoch
    from a generator seeded with ``seed`` (``iterate_batches``), cut at ``limit`` batches
    (``train_local_vectorized``'s plan of each client)."""
    generator = torch.Generator().manual_seed(seed)
    plan: list[torch.Tensor] = []
    for _ in range(epochs):
        if n == 0 or (limit is not None and len(plan) >= limit):
            break
        plan.extend(epoch_batches(torch.randperm(n, generator=generator), batch_size, merge_lone=merge_lone))
    return plan if limit is None else plan[:limit]


@contextmanager
def lone_example(model: nn.Module, batch_size: int) -> Iterator[None]:
    """For a batch of one example, the model's train-mode BatchNorm layers in eval mode (running
    statistics used and left unchanged); any other batch as it is."""
    layers = batchnorm_layers(model) if batch_size == 1 else []
    for layer in layers:
        layer.eval()
    try:
        yield
    finally:
        for layer in layers:
            layer.train()


def with_lone_examples(step: S) -> S:
    """``step(model, batch, ...)`` run under ``lone_example`` for its batch (``train_local``'s
    step, whichever the plugin gave)."""

    def guarded(model: nn.Module, batch: dict[str, torch.Tensor], *args: object) -> object:
        with lone_example(model, len(next(iter(batch.values())))):
            return step(model, batch, *args)

    return guarded  # type: ignore[return-value]
