"""Sparsification: a few coordinates of each tensor sent, the rest dropped (or kept for error
feedback). ``k`` is ``ceil(fraction * d)``, at least 1, so at least the asked fraction is sent.

- top-k (Aji and Heafield 2017; Stich et al. 2018): the k largest magnitudes; each index travels
  in the fewest bits that number the tensor's coordinates, ``ceil(log2 d)``, bit-packed. Where the
  values and indices would weigh as much as the tensor (a large fraction), the tensor goes whole.
- random-k: k coordinates drawn from the generator, which the receiver seeds alike (a pure
  function of run seed, round and client), so only the values travel. With error feedback they go
  as they are (Stich et al. 2018: the residual carries the rest); without it they are scaled by
  ``d / k`` (Wangni et al. 2018), so that ``E[C(x)] = x``: unscaled, ``E[C(x)] = (k / d) x``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from raysim.compress.codec import Encoded, Memory, dense_bytes, packed_bytes, whole


def num_kept(fraction: float, numel: int) -> int:
    """k: ``ceil(fraction * d)``, at least one coordinate. The fraction is read as written (its
    shortest decimal), so 0.07 of 100 is 7, where float error would make 7.000000000000001 -> 8."""
    return max(1, min(numel, math.ceil(Fraction(repr(fraction)) * numel)))


def index_bits(numel: int) -> int:
    """Bits of one index into ``numel`` coordinates: ``ceil(log2 numel)``, at least 1."""
    return max(1, (numel - 1).bit_length())


def _kept(tensor: torch.Tensor, chosen: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    flat = tensor.reshape(-1)
    out = torch.zeros_like(flat)
    out[chosen] = flat[chosen] * scale  # times 1.0 is exact
    return out.reshape(tensor.shape)


@dataclass(frozen=True)
class TopSparse:
    fraction: float

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        d = tensor.numel()
        k = num_kept(self.fraction, d)
        sent = k * tensor.element_size() + packed_bytes(k, index_bits(d))
        if sent >= dense_bytes(tensor):  # k near d: the indices cost more than the tensor saves
            return whole(tensor)
        chosen = tensor.reshape(-1).abs().topk(k, sorted=False).indices
        return Encoded(_kept(tensor, chosen), sent, {})


@dataclass(frozen=True)
class RandomSparse:
    fraction: float
    unbiased: bool = False  # values scaled by d / k: for use without error feedback

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        d = tensor.numel()
        k = num_kept(self.fraction, d)
        if k == d:
            return whole(tensor)
        chosen = torch.randperm(d, generator=generator, device=generator.device)[:k]
        scale = d / k if self.unbiased else 1.0
        return Encoded(_kept(tensor, chosen.to(tensor.device), scale), k * tensor.element_size(), {})
