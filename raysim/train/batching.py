"""How a client's examples become training batches: its arrays as tensors on the device once, then
shuffled batches drawn from them as index views.

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
    tensors = to_tensors(data, device)
    for batch in iterate_batches(tensors, batch_size, generator, merge_lone=has_batchnorm(model)): ...
    with lone_example(model, len(batch["y"])): loss = step(...)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from raysim.types import ClientData

S = TypeVar("S", bound=Callable[..., object])
Batch = dict[str, torch.Tensor]


def to_tensors(data: ClientData, device: torch.device | str = "cpu") -> Batch:
    """Moves a client's arrays to ``device`` once; batches are then index views."""
    # Arrays read from a memory map are read-only; torch needs writable memory.
    return {
        k: to_device(torch.from_numpy(np.require(v, requirements="W")), device)
        for k, v in data.arrays.items()
    }


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``; to a GPU through pinned memory without waiting: a pageable copy
    waits for the card's queue to drain, which would idle it between clients."""
    if torch.device(device).type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def iterate_batches(
    tensors: Batch, batch_size: int, generator: torch.Generator | None = None, *, merge_lone: bool = False
) -> Iterator[Batch]:
    """Yields batches, shuffled when ``generator`` is given; with ``merge_lone`` (a BatchNorm
    model's training) a last batch of one joins the one before (``epoch_batches``)."""
    first = next(iter(tensors.values()))
    n = len(first)
    # drawn on the CPU (the generator decides), moved to the device once per pass
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for idx in epoch_batches(to_device(order, first.device), batch_size, merge_lone=merge_lone):
        yield {k: v[idx] for k, v in tensors.items()}


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
