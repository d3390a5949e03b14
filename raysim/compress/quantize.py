"""Quantization: every coordinate sent in a few bits.

- QSGD (Alistarh et al., NeurIPS 2017, arXiv:1610.02132): the tensor is cut into buckets of
  ``bucket`` consecutive values (the whole tensor when 0), each with its own norm. With
  ``s = 2^bits - 1`` levels, coordinate i becomes ``||v||_2 * sign(v_i) * xi_i``, ``v`` its bucket,
  where ``xi_i`` is ``l / s`` or ``(l + 1) / s`` around ``|v_i| / ||v|| * s``, rounded up with
  probability the remainder: unbiased, with ``E||Q(v) - v||^2 <= min(b / s^2, sqrt(b) / s) ||v||^2``
  per bucket of b values (their Lemma 3.1). Sent: one sign bit and ``bits`` level bits per
  coordinate, bit-packed, and one float32 norm per bucket.
- scaled sign (EF-SGD, Karimireddy et al., ICML 2019, arXiv:1901.09847): ``||p||_1 / d * sign(p)``,
  one bit per coordinate (zero counts as +) and the scale as float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.compress.codec import SCALE_BYTES, Encoded, Memory, packed_bytes


@dataclass(frozen=True)
class Quantized:
    bits: int
    bucket: int  # values per norm; 0: the whole tensor

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        levels, d = 2**self.bits - 1, tensor.numel()
        size = self.bucket if 0 < self.bucket < d else max(d, 1)
        buckets = -(-d // size)
        draws = torch.rand(tensor.shape, generator=generator, device=generator.device).to(tensor.device)
        values, draws = (_rows(t.reshape(-1), buckets, size) for t in (tensor, draws))
        norms = values.norm(dim=1, keepdim=True)
        scaled = values.abs() / torch.where(norms > 0, norms, 1.0) * levels  # a zero bucket stays zero
        low = scaled.floor()
        level = low + (draws < scaled - low).to(tensor.dtype)
        decoded = (norms * values.sign() * level / levels).reshape(-1)[:d].reshape(tensor.shape)
        return Encoded(decoded, packed_bytes(d, self.bits + 1) + SCALE_BYTES * buckets, {})


def _rows(flat: torch.Tensor, rows: int, size: int) -> torch.Tensor:
    """``flat`` as ``rows`` rows of ``size``, the last padded with zeros (which change no norm)."""
    return torch.nn.functional.pad(flat, (0, rows * size - flat.numel())).reshape(rows, size)


@dataclass(frozen=True)
class Sign:
    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        scale = tensor.abs().sum() / tensor.numel()
        signs = torch.where(tensor >= 0, 1.0, -1.0).to(tensor.dtype)
        return Encoded(scale * signs, packed_bytes(tensor.numel(), 1) + SCALE_BYTES, {})
