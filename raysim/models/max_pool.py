"""Max-pooling that takes torch's fast CPU kernel in each direction: ``nn.MaxPool2d``'s bits.

torch's CPU max-pool forward over a contiguous (NCHW) map walks each window element by element;
over a channels-last map it compares a pixel's channels a vector at a time. On the pfl CNN's
10x64x28x28 map, on one core, that is 2.9 ms against 0.19 ms, more than the layout copies the
contiguous case then needs (about 0.75 ms). The backward kernel is fast (0.17 ms) when the
gradient comes in the input's layout; a channels-last input whose gradient arrives contiguous (a
``Flatten`` after the pool makes it so) takes a slow mixed path (1.4 ms). So:

- a contiguous map pools channels-last copies of a few images at a time (each copy stays in
  cache: a 51 MB evaluation batch copied whole took twice as long), hands on the output (and
  keeps the indices) contiguous, and its backward is torch's contiguous kernel;
- a channels-last map pools as torch does, and its gradient is laid out channels-last before
  torch's backward reads it (a hook; a gradient already so is left alone).

Both forward kernels pick the same window element, the first maximum in scan order, and the last
NaN where there is one. The output, the indices and the gradient are therefore
``nn.MaxPool2d``'s, bit for bit, in either layout, with overlapping windows too: each backward is
the kernel ``nn.MaxPool2d``'s autograd calls, on the same indices. Where the fast path does not
apply it is ``nn.MaxPool2d`` itself: on a GPU, for an input other than a float32 or float64
batch of maps, with ``return_indices``, and inside ``torch.func`` transforms (``vmap`` of the
vectorized trainer, per-example gradients), which a custom autograd function would need rules for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_FAST_DTYPES = (torch.float32, torch.float64)


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with the same results, faster on the CPU (module docstring). A drop-in
    subclass: same arguments, no parameters or buffers, ``isinstance(m, nn.MaxPool2d)``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.return_indices or not fast_path_applies(input):
            return super().forward(input)
        if _is_channels_last(input):  # torch's forward is the fast one; its gradient may not be
            pooled = super().forward(input)
            if pooled.requires_grad:
                pooled.register_hook(_channels_last)
            return pooled
        window = (_pair(self.kernel_size), _pair(self.stride), _pair(self.padding), _pair(self.dilation))
        return _PooledChannelsLast.apply(input, *window, self.ceil_mode)


def fast_path_applies(x: torch.Tensor) -> bool:
    """A non-empty CPU float32/float64 batch of maps (N, C, H, W), outside ``torch.func`` transforms."""
    return (
        x.device.type == "cpu"
        and x.dim() == 4
        and x.dtype in _FAST_DTYPES
        and x.numel() > 0
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
    )


def _pair(value: int | tuple[int, ...]) -> list[int]:
    return [value, value] if isinstance(value, int) else list(value)


def _is_channels_last(x: torch.Tensor) -> bool:
    """Laid out channels-last and not also contiguous (a one-channel or 1x1 map is both: there
    the contiguous kernels run, as ``nn.MaxPool2d``'s would)."""
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _channels_last(grad: torch.Tensor) -> torch.Tensor:
    """The gradient of a channels-last pool's output, laid out as the output (unchanged if it is)."""
    return grad.contiguous(memory_format=torch.channels_last)


class _PooledChannelsLast(torch.autograd.Function):
    """A contiguous map's pool: forward on channels-last copies, backward on the contiguous kernel."""

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
        keep = ctx.needs_input_grad[0]  # nn.MaxPool2d's autograd keeps the input and the indices
        pooled = indices = None
        at = 0
        for part in x.split(_images_per_copy(x)):  # each copy, its pool and their results in cache
            part_pooled, part_indices = torch.ops.aten.max_pool2d_with_indices(_laid_out(part), *window)
            if pooled is None:  # contiguous, the layout nn.MaxPool2d hands on
                pooled = part_pooled.new_empty((len(x), *part_pooled.shape[1:]))
                indices = part_indices.new_empty(pooled.shape) if keep else None
            pooled[at : at + len(part)] = part_pooled
            if indices is not None:
                indices[at : at + len(part)] = part_indices
            at += len(part)
        assert pooled is not None, "fast_path_applies refuses an empty batch"
        if keep:
            ctx.save_for_backward(x, indices)
            ctx.window = window
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, indices = ctx.saved_tensors
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, *ctx.window, indices)
        return grad_x, None, None, None, None, None


# bytes of a contiguous map copied channels-last at a time: a copy that stays in cache. A whole
# evaluation batch of pfl's CNN (256x64x28x28, 51 MB) pooled in 2 MiB copies took half the time
# of one copy on the 2-core VM; 1-4 MiB were alike.
_COPY_BYTES = 1 << 21


def _laid_out(part: torch.Tensor) -> torch.Tensor:
    return part.contiguous(memory_format=torch.channels_last)


def _images_per_copy(x: torch.Tensor) -> int:
    return max(1, _COPY_BYTES // max(1, x[0].numel() * x.element_size()))
