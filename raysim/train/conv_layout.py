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

One shape stays contiguous: a strided 1x1 convolution over fewer than 8 input channels (a small
ResNet's shortcut), whose channels-last backward in torch 2.13's oneDNN writes past its buffer on
an AVX2 core with one thread (glibc's malloc checks catch it at once; without them a later
allocation aborts, 2026-12-07). A model that holds one trains contiguous, under ``on`` too (warned).

Usage:
    with channels_last(model) if wants_channels_last(config.channels_last, model, device) else nullcontext():
        ... the client's optimizer and steps
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from raysim.config.sections import OnOffAuto

logger = logging.getLogger(__name__)


def wants_channels_last(mode: OnOffAuto, model: nn.Module, device: torch.device | str) -> bool:
    """``on`` always, ``off`` never, ``auto`` for a model with a 2-D convolution on the CPU (on a
    GPU the card's kernels decide, and that is not measured yet). On the CPU, never for a model
    with a convolution that oneDNN mishandles channels-last (``mishandled``): under ``on`` such a
    model trains contiguous, with a warning naming the convolution (once a process)."""
    if mode == "off":
        return False
    if torch.device(device).type != "cpu":
        return mode == "on"
    convs = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    unsafe = next((name for name, conv in convs if mishandled(conv)), None)
    if unsafe is None:
        return mode == "on" or bool(convs)
    if mode == "on" and unsafe not in _warned:
        _warned.add(unsafe)
        logger.warning(
            "algorithm.local.channels_last: on, but the model's convolution %r (1x1, strided, over "
            "fewer than 8 channels a group) corrupts memory channels-last in torch's CPU kernels: it "
            "trains contiguous",
            unsafe,
        )
    return False


# the convolutions ``on`` was refused for, by name: warned of once a process, whichever model
_warned: set[str] = set()


def mishandled(conv: nn.Conv2d) -> bool:
    """A strided 1x1 convolution over fewer than 8 input channels a group: the module docstring's
    oneDNN fault."""
    return conv.kernel_size == (1, 1) and max(conv.stride) > 1 and conv.in_channels // conv.groups < 8


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
