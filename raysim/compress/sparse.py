"""Sparsification: a few coordinates of each tensor sent, the rest dropped (or kept for error
feedback). ``k`` is ``fraction * d`` rounded to the nearest integer, at least 1; with ``k == d``
the tensor goes whole, no index needed.

- top-k (Aji and Heafield 2017; Stich et al. 2018): the k largest magnitudes; each index travels
  in the fewest bits that number the tensor's coordinates, ``ceil(log2 d)``, bit-packed.
- random-k (Stich et al. 2018): k coordinates drawn from the generator, which the receiver seeds
  alike (a pure function of run seed, round and client), so only the values travel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.compress.codec import Encoded, Memory, dense_bytes, packed_bytes


def num_kept(fraction: float, numel: int) -> int:
    """k: ``fraction * d`` rounded, at least one coordinate."""
    return max(1, min(numel, round(fraction * numel)))


def index_bits(numel: int) -> int:
    """Bits of one index into ``numel`` coordinates: ``ceil(log2 numel)``, at least 1."""
    return max(1, (numel - 1).bit_length())


def _kept(tensor: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    flat = tensor.reshape(-1)
    out = torch.zeros_like(flat)
    out[chosen] = flat[chosen]
    return out.reshape(tensor.shape)


@dataclass(frozen=True)
class TopSparse:
    fraction: float

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        d = tensor.numel()
        k = num_kept(self.fraction, d)
        if k == d:
            return Encoded(tensor.clone(), dense_bytes(tensor), {})
        chosen = tensor.reshape(-1).abs().topk(k, sorted=False).indices
        values = k * tensor.element_size()
        return Encoded(_kept(tensor, chosen), values + packed_bytes(k, index_bits(d)), {})


@dataclass(frozen=True)
class RandomSparse:
    fraction: float

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        d = tensor.numel()
        k = num_kept(self.fraction, d)
        if k == d:
            return Encoded(tensor.clone(), dense_bytes(tensor), {})
        chosen = torch.randperm(d, generator=generator, device=generator.device)[:k]
        return Encoded(_kept(tensor, chosen.to(tensor.device)), k * tensor.element_size(), {})
