"""Dropout for vectorized training: each client's masks a pure function of its seed.

``vmap``'s own randomness draws one stream for the whole chunk, so a client's masks would depend
on which clients share its chunk (and so on the worker count). Here every mask element is drawn
from a counter-based hash (splitmix64) of the client's key, the step, the dropout call within the
step and the element's index: the same client draws the same masks in any chunk, at any position.
One 64-bit hash gives four elements 16 bits each (a keep probability exact to 2**-16): the hash's
integer arithmetic over every element cost a third of a vectorized step on the CPU benchmark's
CNN, a quarter of the elements a quarter of that.
They are not the masks ``torch.manual_seed(ctx.seed)`` gives the sequential loop, so a model with
dropout trains vectorized to a different (equally distributed) result. A transformers model's
attention dropout, drawn inside its attention function, goes through its attention modules'
``nn.Dropout`` meanwhile (``raysim.train.vmap_attention``), so it is hashed too.

Usage:
    dropout = HashedDropout(model)                     # the model's nn.Dropout layers
    for step, *rest in dropout.over(steps):            # their forward hashes meanwhile
        ...  # inside the vmapped function, before the forward: dropout.begin_forward(key)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard, TypeVar

import torch
from torch import nn

from raysim.train.vmap_attention import vmap_attention

T = TypeVar("T", bound=tuple[Any, ...])
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_CALLS_PER_STEP = 1 << 16  # dropout calls one forward may make before two steps' counters meet


def _signed(value: int) -> int:
    """A 64-bit constant as torch's int64 holds it (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical shift of int64 ``x`` (torch's ``>>`` is arithmetic: it copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """Steele et al.'s SplitMix64 finaliser on int64 tensors (multiplications wrap modulo 2**64)."""
    z = x + _signed(_GOLDEN)
    z = (z ^ _shift_right(z, 30)) * _signed(_MIX1)
    z = (z ^ _shift_right(z, 27)) * _signed(_MIX2)
    return z ^ _shift_right(z, 31)


def hashed_words(key: torch.Tensor, counter: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """Uniform integers in [0, 2**16) of ``shape`` (int64), a pure function of ``key`` (an int64
    tensor, one per client under vmap), ``counter`` and each element's index: element ``i`` is
    the ``i % 4``-th 16 bits of the hash of word ``i // 4``."""
    count = shape.numel()
    words = torch.arange((count + 3) // 4, device=device, dtype=torch.int64)
    stream = splitmix64(key * _signed(_GOLDEN) + counter)  # one stream per (key, counter)
    hashes = splitmix64(words ^ stream)
    quarters = torch.arange(0, 64, 16, device=device, dtype=torch.int64)
    # an arithmetic shift copies the sign bit into the top, which the mask drops again
    return ((hashes.unsqueeze(-1) >> quarters) & 0xFFFF).flatten()[:count].view(shape)


def hashed_uniform(key: torch.Tensor, counter: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """Uniform floats in [0, 1) on the grid of 2**-16, ``hashed_words`` scaled."""
    return hashed_words(key, counter, shape, device).to(torch.float32) * 2.0**-16


class HashedDropout:
    """Swaps the forward of ``model``'s ``nn.Dropout`` layers for hashed masks while active; of its
    subclasses only those that declare ``nn.Dropout``'s law (``hashes_as_nn_dropout``, as the
    built-in models' ``raysim.models.dropout.Dropout`` does): another forward (a mask shared along
    a dimension, dropout kept on in evaluation) draws under ``vmap`` and so is refused there."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers = [m for m in model.modules() if _has_nn_dropouts_law(m) and m.p > 0]
        self.keys = torch.zeros((), dtype=torch.int64)  # set inside the vmapped function
        self.step = 0
        self._calls = 0

    def begin_forward(self, keys: torch.Tensor) -> None:
        """Inside the vmapped function, before the forward: the clients' keys; calls count afresh."""
        self.keys, self._calls = keys, 0

    def over(self, steps: Iterator[T]) -> Iterator[T]:
        """``steps`` (tuples whose first item is the step) with the layers drawing from the hash
        and transformers' attention through ``vmap_attention`` while they run; each layer's own
        forward is back afterwards, also on an error."""
        for layer in self.layers:
            layer.forward = self._forward(layer)  # type: ignore[method-assign, assignment]
        try:
            with vmap_attention(self.model):
                for item in steps:
                    self.step = item[0]
                    yield item
        finally:
            for layer in self.layers:
                del layer.forward  # the class's forward again

    def _forward(self, layer: nn.Dropout) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            if not layer.training:
                return x
            counter = self.step * _CALLS_PER_STEP + self._calls
            self._calls += 1
            keep = hashed_words(self.keys, counter, x.shape, x.device) >= math.ceil(layer.p * 2**16)
            return torch.where(keep, x * (1.0 / (1.0 - layer.p)), 0.0)

        return forward


def _has_nn_dropouts_law(module: nn.Module) -> TypeGuard[nn.Dropout]:
    declared = getattr(type(module), "hashes_as_nn_dropout", False)
    return type(module) is nn.Dropout or (isinstance(module, nn.Dropout) and declared is True)
