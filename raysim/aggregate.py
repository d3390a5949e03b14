"""Associative aggregators: workers fold client results into partials, the driver merges them.

Every aggregator obeys ``result(merge(add(add(zero(), a), b), add(zero(), c)))`` == the same
over any grouping, so a round's outcome does not depend on how clients were spread over workers
(up to float rounding; partials accumulate in float64 to keep that rounding below 1e-6).

``add`` and ``merge`` may update their accumulator in place and return it (one fused pass per
client instead of three allocations): use the returned value, never an accumulator passed in.

Usage:
    agg = WeightedMean(); acc = agg.zero()
    for r in results: acc = agg.add(acc, position, r)
    mean_update = agg.result(agg.merge(acc, other_worker_acc))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from raysim.params import tree_map
from raysim.types import ClientResult


class Aggregator(Protocol):
    """zero / add / merge / result; ``position`` is the client's index in the round's cohort."""

    def zero(self) -> Any: ...

    def add(self, acc: Any, position: int, result: ClientResult) -> Any: ...

    def merge(self, left: Any, right: Any) -> Any: ...

    def result(self, acc: Any) -> Any: ...


@dataclass(frozen=True)
class _Sums:
    total: Any  # tree of float64 tensors, or None before the first add
    weight: float
    count: int


def _merge_sums(left: _Sums, right: _Sums) -> _Sums:
    return _Sums(_fold(left.total, right.total, 1.0), left.weight + right.weight, left.count + right.count)


def _fold(total: Any, update: Any, scale: float) -> Any:
    """``total + scale * update`` in float64, in place when ``total`` exists.

    Partials stay on the updates' device (a GPU worker copies one partial to the host per round,
    not one update per client); merging partials that arrive from workers happens on the CPU.
    """
    if update is None:
        return total
    if total is None:
        return tree_map(lambda t: t.detach().to(torch.float64, copy=True).mul_(scale), update)
    return tree_map(lambda acc, t: acc.add_(t.detach().to(acc.device), alpha=scale), total, update)


class WeightedMean:
    """Mean of ``update`` trees weighted by ``result.weight`` (uniform when ``weighted=False``).

    ``result`` returns ``None`` when no client contributed.
    """

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = weighted

    def zero(self) -> _Sums:
        return _Sums(None, 0.0, 0)

    def add(self, acc: _Sums, position: int, result: ClientResult) -> _Sums:
        w = float(result.weight) if self.weighted else 1.0
        return _Sums(_fold(acc.total, result.update, w), acc.weight + w, acc.count + 1)

    def merge(self, left: _Sums, right: _Sums) -> _Sums:
        return _merge_sums(left, right)

    def result(self, acc: _Sums) -> Any:
        if acc.total is None or acc.weight == 0:
            return None
        return tree_map(lambda t: (t / acc.weight).to(torch.float32), acc.total)


class Sum:
    """Plain sum of ``update`` trees (FedFish sums w·F·delta and w·F itself); None when empty."""

    def zero(self) -> _Sums:
        return _Sums(None, 0.0, 0)

    def add(self, acc: _Sums, position: int, result: ClientResult) -> _Sums:
        return _Sums(_fold(acc.total, result.update, 1.0), acc.weight + float(result.weight), acc.count + 1)

    def merge(self, left: _Sums, right: _Sums) -> _Sums:
        return _merge_sums(left, right)

    def result(self, acc: _Sums) -> Any:
        if acc.total is None:
            return None
        return tree_map(lambda t: t.to(torch.float32), acc.total)


class Gather:
    """Keeps every result with its cohort position, ordered by position (FuseFL composes blocks).

    ``result`` returns ``[(position, ClientResult), ...]``; a position indexes the round's cohort,
    so a plugin knows which client sent what even when failed clients were dropped.
    """

    def zero(self) -> list[tuple[int, ClientResult]]:
        return []

    def add(self, acc: list, position: int, result: ClientResult) -> list:
        # copies: an update may be a view of the worker's resident model, which the next
        # client overwrites
        kept = replace(result, update=tree_map(lambda t: t.detach().clone(), result.update))
        return [*acc, (position, kept)]

    def merge(self, left: list, right: list) -> list:
        return sorted([*left, *right], key=lambda item: item[0])

    def result(self, acc: list) -> list[tuple[int, ClientResult]]:
        return sorted(acc, key=lambda item: item[0])
