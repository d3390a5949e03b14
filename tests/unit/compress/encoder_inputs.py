"""Tensors and generators the encoder tests share."""

from __future__ import annotations

import math

import torch


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def distinct(*shape: int, seed: int = 0) -> torch.Tensor:
    """Values of distinct magnitudes, signs mixed: top-k's answer is unique."""
    n = math.prod(shape)
    magnitudes = torch.randperm(n, generator=gen(seed)).double() + 1
    signs = torch.where(torch.rand(n, generator=gen(seed + 1)) < 0.5, -1.0, 1.0).double()
    return (magnitudes * signs).reshape(shape)
