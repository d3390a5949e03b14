"""Max-pooling that takes torch's fast CPU kernel in each direction: ``nn.MaxPool2d``'s bits.

torch's CPU max-pool forward over a contiguous (NCHW) map walks each window element by element;
over a channels-last map it compares a pixel's channels a vector at a time. On the pfl CNN's
10x64x28x28 map, on one core, that is 2.9 ms against 0.19 ms, more than the layout copies the
contiguous case then needs (about 0.75 ms). The backward kernel is fast (0.17 ms) when the
gradient comes in the input's layout; a channels-last input whose gradient arrives contiguous (a
``Flatten`` after the pool makes it so) takes a slow mixed path (1.4 ms). So, by the layout torch
itself would pool the input in (``suggest_memory_format``):

- a contiguous batch of maps of 65,536 elements or more pools channels-last copies of a few
  images at a time (each copy stays in cache: a 51 MB evaluation batch copied whole took twice
  as long), hands on the output contiguous, and its backward is torch's contiguous kernel on the
  indices it kept; a smaller one is torch's (the copies' fixed cost would exceed the gain);
- a channels-last map pools as torch does, and its gradient is laid out channels-last before
  torch's backward reads it (a hook; a gradient already so is left alone).

Both forward kernels pick the same window element, the first maximum in scan order, and the last
NaN where there is one. The output (values and strides) and the input's gradient are therefore
``nn.MaxPool2d``'s, bit for bit, with overlapping windows too: each backward is the kernel
``nn.MaxPool2d``'s autograd calls, on the same indices. Where the fast path does not apply it is
``nn.MaxPool2d`` itself: on a GPU, for an input other than a float32 or float64 batch of maps,
with ``return_indices``, inside ``torch.func`` transforms (``vmap`` of the vectorized trainer,
per-example gradients), under forward-mode AD and under ``torch.compile``. Not scriptable with
``torch.jit.script`` (``nn.MaxPool2d`` is).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._prims_common import suggest_memory_format
from torch.autograd import forward_ad

from raysim.models.eager_cpu import eager_cpu_float


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with the same results, faster on the CPU (module docstring). A drop-in
    subclass: same arguments, no parameters or buffers, ``isinstance(m, nn.MaxPool2d)``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.return_indices or not fast_path_applies(input):
            return super().forward(input)
        if _torch_pools_channels_last(input):  # torch's forward is the fast one
            pooled = super().forward(input)
            if pooled.requires_grad:  # its backward is, given the gradient in the same layout
                pooled.register_hook(_channels_last)
            return pooled
        if input.numel() < _SMALLEST_COPIED:
            return super().forward(input)
        window = (_pair(self.kernel_size), _pair(self.stride), _pair(self.padding), _pair(self.dilation))
        if torch.is_grad_enabled() and input.requires_grad:
            return _PooledChannelsLast.apply(input, *window, self.ceil_mode)
        return _pooled_in_copies(input, (*window, self.ceil_mode), with_indices=False)[0]


def fast_path_applies(x: torch.Tensor) -> bool:
    """A non-empty CPU float32/float64 batch of maps (N, C, H, W) on torch's eager path
    (``eager_cpu_float``), and no forward-mode AD (a custom autograd function would need a rule
    of its own there)."""
    return (
        eager_cpu_float(x)
        and x.dim() == 4
        and x.numel() > 0
        and forward_ad._current_level < 0  # no dual level entered
    )


def _pair(value: int | tuple[int, ...]) -> list[int]:
    return [value, value] if isinstance(value, int) else list(value)


def _torch_pools_channels_last(x: torch.Tensor) -> bool:
    """Whether torch pools ``x`` in its channels-last kernel, handing on a channels-last output:
    by the layout its strides suggest (``suggest_memory_format``). The two dense layouts of
    maps with several channels and pixels are told apart in C++, the rest (one channel, 1x1
    maps, strided views) by torch's own rule, which costs 16 us in Python."""
    several = x.shape[1] > 1 and x.shape[2] * x.shape[3] > 1
    if several and x.is_contiguous():
        return False
    if several and x.is_contiguous(memory_format=torch.channels_last):
        return True
    return suggest_memory_format(x) == torch.channels_last


def _channels_last(grad: torch.Tensor) -> torch.Tensor:
    """The gradient of a channels-last pool's output, laid out as the output (unchanged if it is)."""
    return grad.contiguous(memory_format=torch.channels_last)


class _PooledChannelsLast(torch.autograd.Function):
    """A contiguous map's pool: forward in channels-last copies, backward on the contiguous kernel."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        kernel: list[int],
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        ceil_mode: bool,
    ) -> torch.Tensor:
        window = (kernel, stride, padding, dilation, ceil_mode)
        pooled, indices = _pooled_in_copies(x, window, with_indices=True)
        ctx.save_for_backward(x, indices)  # what nn.MaxPool2d's autograd keeps
        ctx.window = window
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, indices = ctx.saved_tensors
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, *ctx.window, indices)
        return grad_x, None, None, None, None, None


def _pooled_in_copies(
    x: torch.Tensor, window: tuple[list[int], list[int], list[int], list[int], bool], with_indices: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` pooled a few images at a time, each copied channels-last (the copy, its pool and
    their results stay in cache), into a contiguous output, and contiguous indices if asked."""
    pooled = indices = None
    at = 0
    for part in x.split(_images_per_copy(x)):
        part_pooled, part_indices = torch.ops.aten.max_pool2d_with_indices(
            part.contiguous(memory_format=torch.channels_last), *window
        )
        if pooled is None:  # contiguous, the layout nn.MaxPool2d hands on
            pooled = part_pooled.new_empty((len(x), *part_pooled.shape[1:]))
            indices = part_indices.new_empty(pooled.shape) if with_indices else None
        pooled[at : at + len(part)] = part_pooled
        if indices is not None:
            indices[at : at + len(part)] = part_indices
        at += len(part)
    assert pooled is not None, "fast_path_applies refuses an empty batch"
    return pooled, indices


# elements of the smallest contiguous batch of maps worth the copies: below it their fixed cost
# (about 45 us without gradients, 150 us with the backward, on the 2-core VM) is more than the
# slow kernel takes; from 10x32x14x14 (62,720) on, the copies were faster both ways
_SMALLEST_COPIED = 1 << 16
# bytes of a contiguous map copied channels-last at a time: a copy that stays in cache. A whole
# evaluation batch of pfl's CNN (256x64x28x28, 51 MB) pooled in 2 MiB copies took half the time
# of one copy on the 2-core VM; 1-4 MiB were alike.
_COPY_BYTES = 1 << 21


def _images_per_copy(x: torch.Tensor) -> int:
    return max(1, _COPY_BYTES // max(1, x[0].numel() * x.element_size()))
