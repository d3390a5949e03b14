"""The convolutions of a client's training in channels-last memory (``LocalTrainConfig.channels_last``).

On the CPU, oneDNN's convolution kernels run faster when the weights (and so the feature maps) lie
channels-last in memory (N, H, W, C): a training step of raysim's convolutional models took
0.75-0.93x the time on four of them and 1.01x on pfl's CNN (one thread, docs/performance.md). A
convolution whose weight is channels-last runs channels-last whatever its input: laying out the
weights, not the images, reaches the convolutions after a one-channel image too (an (N, 1, H, W)
tensor is both layouts at once, and so is a weight over one channel).

Only the layout changes: the same values, in parameters that keep their identity (each 4-D
weight's data, and its gradient, are swapped for a copy laid out anew). The sums inside the
kernels run in another order, so a trained model differs in its last bits from a contiguous
run's; and a dropout over feature maps draws its mask in memory order, so it drops other
elements (an equally distributed draw: the model trains differently, not worse). Outside the
block the model is contiguous again: the update, the partials and every plugin see the layout
they always saw. A model or hook that flattens a feature map, weight or gradient with ``.view``
refuses channels-last ones; the error then names this setting.

Usage:
    with channels_last(model) if wants_channels_last(config.channels_last, model, device) else nullcontext():
        ... the client's optimizer and steps
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from raysim.config.sections import OnOffAuto


def wants_channels_last(mode: OnOffAuto, model: nn.Module, device: torch.device | str) -> bool:
    """``on`` always, ``off`` never, ``auto`` for a model with a 2-D convolution on the CPU (on a
    GPU the card's kernels decide, and that is not measured yet)."""
    if mode != "auto":
        return mode == "on"
    return torch.device(device).type == "cpu" and any(isinstance(m, nn.Conv2d) for m in model.modules())


@contextmanager
def channels_last(model: nn.Module) -> Iterator[None]:
    """``model``'s 4-D weights (and their gradients) channels-last inside the block, contiguous after it.

    Raises:
        RuntimeError: torch's, where something in the block ``.view``-ed a channels-last tensor,
            with the setting that avoids it.
    """
    _lay_out(model, torch.channels_last)
    try:
        yield
    except RuntimeError as exc:
        if "view size is not compatible" not in str(exc):
            raise
        raise RuntimeError(
            f"{exc} (this client trained with its convolution weights channels-last: make the model "
            "or hook reshape instead of view, or set algorithm.local.channels_last: off)"
        ) from exc
    finally:
        _lay_out(model, torch.contiguous_format)


def _lay_out(model: nn.Module, layout: torch.memory_format) -> None:
    """Each 4-D parameter, and its gradient, in ``layout`` (a 5-D one, a 3-D convolution's, as built)."""
    # ``to``, as ``nn.Module.to`` does: it lays out a 1x1 kernel anew too, where ``contiguous``
    # keeps it as it is (its strides pass for both layouts) and the kernels read it so
    for param in model.parameters():
        if param.dim() == 4:
            param.data = param.data.to(memory_format=layout)
            if param.grad is not None:
                param.grad = param.grad.to(memory_format=layout)
