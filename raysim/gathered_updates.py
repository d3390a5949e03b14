"""Every client's update kept, flat, for the rules that need them all (``raysim.robust``).

A robust rule (the median, Krum, ...) or ALIE's attacker reads every update of the round, not
their sum: ``GatheredUpdates`` stands in for a plugin's ``WeightedMean`` and keeps each update as
one float32 vector (its floating-point leaves in ``raysim.params.float_leaves``' order) with its
weight and cohort position. Partials merge by concatenation, ordered by position, so the rows a
round ends with do not depend on how clients were spread over workers. As ``ClippedSums`` does
for central DP, ``result`` returns the merged partial itself: the driver releases it
(``raysim.robust.release``), which gives the plugin the same tree ``WeightedMean`` would.

Memory: a worker holds a vector per client it trained (``WeightedMean`` one running sum), the
driver ``n x d`` float32 for a cohort of ``n`` updates of ``d`` values.

Usage:
    gather = GatheredUpdates(WeightedMean()); acc = gather.add(gather.zero(), 0, result)
    rows = gather.result(gather.merge(acc, other))      # Gathered: positions, weights, vectors
    mean = unflatten(torch.stack(rows.vectors).mean(0), rows.template)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.params import tree_map
from raysim.types import ClientResult


class LeafShape:
    """A tensor leaf's shape in a template: a plain object, so ``tree_map`` treats it as a leaf."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


@dataclass(frozen=True)
class Gathered:
    """A round's updates so far: cohort positions ascending, each with its weight and vector."""

    positions: list[int] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    vectors: list[torch.Tensor] = field(default_factory=list)
    template: Any = None  # the updates' tree with ``LeafShape`` leaves; None before the first


def flatten(tree: Any) -> torch.Tensor:
    """``tree``'s floating-point leaves as one float32 vector on their device."""
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in P.float_leaves(tree)])


def template_of(tree: Any) -> Any:
    """``tree`` with each tensor replaced by its ``LeafShape``."""
    return tree_map(lambda t: LeafShape(tuple(t.shape)), tree)


def unflatten(vector: torch.Tensor, template: Any) -> Any:
    """The tree of ``template``'s structure holding ``vector``'s values as float32 (``flatten``'s
    inverse; ``WeightedMean``'s result is float32 too)."""
    offset = 0

    def take(leaf: LeafShape) -> torch.Tensor:
        nonlocal offset
        size = int(torch.Size(leaf.shape).numel())
        piece = vector[offset : offset + size].reshape(leaf.shape).to(torch.float32)
        offset += size
        return piece

    tree = tree_map(take, template)
    if offset != vector.numel():
        raise ValueError(f"a vector of {vector.numel()} values for a template of {offset}")
    return tree


class GatheredUpdates:
    """The round's aggregator under a robust rule: every update of ``inner``'s clients, flat.

    ``inner`` is the plugin's ``WeightedMean``; its ``weighted`` decides each row's weight
    (``result.weight``, or 1) as it would have weighted the sum.
    """

    def __init__(self, inner: WeightedMean[Any]) -> None:
        self.inner = inner

    def zero(self) -> Gathered:
        return Gathered()

    def add(self, acc: Gathered, position: int, result: ClientResult) -> Gathered:
        weight = float(result.weight) if self.inner.weighted else 1.0
        template = acc.template if acc.template is not None else template_of(result.update)
        vector = flatten(result.update).clone()  # a copy: the update may view the resident model
        return _sorted([*acc.positions, position], [*acc.weights, weight], [*acc.vectors, vector], template)

    def merge(self, left: Gathered, right: Gathered) -> Gathered:
        template = left.template if left.template is not None else right.template
        return _sorted(
            left.positions + right.positions,
            left.weights + right.weights,
            left.vectors + right.vectors,
            template,
        )

    def result(self, acc: Gathered) -> Gathered:
        return acc


def _sorted(
    positions: list[int], weights: list[float], vectors: list[torch.Tensor], template: Any
) -> Gathered:
    order = sorted(range(len(positions)), key=positions.__getitem__)
    return Gathered(
        [positions[i] for i in order], [weights[i] for i in order], [vectors[i] for i in order], template
    )
