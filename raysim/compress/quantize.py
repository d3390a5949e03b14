"""Quantization: every coordinate sent in a few bits.

- QSGD (Alistarh et al., NeurIPS 2017, arXiv:1610.02132): with ``s = 2^bits - 1`` levels,
  coordinate i becomes ``||v||_2 * sign(v_i) * xi_i`` where ``xi_i`` is ``l / s`` or ``(l + 1) / s``
  around ``|v_i| / ||v|| * s``, rounded up with probability the remainder: unbiased, with
  ``E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2`` (their Lemma 3.1). Sent: one sign bit and
  ``bits`` level bits per coordinate, bit-packed, and the norm as float32.
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

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        levels = 2**self.bits - 1
        norm = tensor.norm()
        message = packed_bytes(tensor.numel(), self.bits + 1) + SCALE_BYTES
        if norm == 0:
            return Encoded(torch.zeros_like(tensor), message, {})
        scaled = tensor.abs() / norm * levels
        low = scaled.floor()
        draws = torch.rand(tensor.shape, generator=generator, device=generator.device).to(tensor.device)
        level = low + (draws < scaled - low).to(tensor.dtype)
        return Encoded(norm * tensor.sign() * level / levels, message, {})


@dataclass(frozen=True)
class Sign:
    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        scale = tensor.abs().sum() / tensor.numel()
        signs = torch.where(tensor >= 0, 1.0, -1.0).to(tensor.dtype)
        return Encoded(scale * signs, packed_bytes(tensor.numel(), 1) + SCALE_BYTES, {})
