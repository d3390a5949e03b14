"""The convolutions of a client's training in channels-last memory (``LocalTrainConfig.channels_last``).

On the CPU, oneDNN's convolution kernels run faster when the weights (and so the feature maps) lie
channels-last in memory (N, H, W, C): a training step of raysim's convolutional models took
0.75-0.93x the time on four of them and 1.01x on pfl's CNN (one thread, docs/performance.md). A
convolution whose weight is channels-last runs channels-last whatever its input: laying out the
weights, not the images, reaches the convolutions after a one-channel image too (an (N, 1, H, W)
tensor is both layouts at once, and so is a weight over one channel).

Only the layout changes: the same values, as parameters with the same identity (each one's data is
swapped for a copy, as ``nn.Module.to`` does). The sums inside the kernels run in another order,
so a trained model differs in its last bits from a contiguous run's. Outside the block the model
is contiguous again: the update, the partials and every plugin see the layout they always saw.

Usage:
    with channels_last(model) if wants_channels_last(config.channels_last, model, device) else nullcontext():
        ... the client's optimizer and steps
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import nn


def wants_channels_last(
    mode: Literal["auto", "on", "off"], model: nn.Module, device: torch.device | str
) -> bool:
    """``on`` always, ``off`` never, ``auto`` for a model with a 2-D convolution on the CPU (on a
    GPU the card's kernels decide, and that is not measured yet)."""
    if mode != "auto":
        return mode == "on"
    return torch.device(device).type == "cpu" and any(isinstance(m, nn.Conv2d) for m in model.modules())


@contextmanager
def channels_last(model: nn.Module) -> Iterator[None]:
    """``model``'s 4-D weights and buffers channels-last inside the block, contiguous after it.

    The optimizer must be made inside: it keeps the parameters' tensors. A model that flattens
    its feature maps with ``.view`` refuses channels-last ones: it must ``reshape`` (``nn.Flatten``
    does), or train with ``channels_last: off``."""
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # stubs lack the keyword
    try:
        yield
    finally:
        model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]
