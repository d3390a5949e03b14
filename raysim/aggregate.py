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

import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

import numpy as np
import torch

from raysim.params import leaves, tree_map
from raysim.types import A_co, ClientResult, Metrics, Tree

# A partial aggregate. Only the aggregator that made it reads it (workers fold into it, the driver
# merges), so its type is the aggregator's own; STYLE's one type parameter per class goes to the
# aggregate, and the partial is left unchecked at this seam, by name.
Partial: TypeAlias = Any
T = TypeVar("T", bound=Tree)  # the structure of the updates an aggregator sums
R = TypeVar("R", bound=ClientResult[Any, Any])  # what a ``Gather`` keeps: the plugin's ClientResult[U, S]
Gathered: TypeAlias = list[tuple[int, R]]  # (cohort position, result), by position
# where a partial's float64 sums are written: a new tensor of that shape and dtype, or None for
# one of the process's own (``placed``)
Memory: TypeAlias = Callable[[torch.Size, torch.dtype], "torch.Tensor | None"]


class Aggregator(Protocol[A_co]):
    """zero / add / merge / result; ``position`` is the client's index in the round's cohort.

    ``result`` is the aggregate the plugin's ``server_update`` receives (``A_co``).
    """

    def zero(self) -> Partial: ...

    def add(self, acc: Partial, position: int, result: ClientResult) -> Partial: ...

    def merge(self, left: Partial, right: Partial) -> Partial: ...

    def result(self, acc: Partial) -> A_co: ...


@runtime_checkable
class Summing(Aggregator[A_co], Protocol):
    """An aggregator whose partial sums each client's contribution as tensors and whose result
    divides by the summed weight: central DP clips the first and fixes the second
    (``raysim.private_sums``). ``WeightedMean`` is one; ``Sum`` and ``Gather`` are not."""

    def with_total_weight(self, acc: Partial, weight: float) -> Partial:
        """``acc`` with its summed weight replaced by ``weight`` (the fixed denominator)."""
        ...


@dataclass(frozen=True)
class _Sums(Generic[T]):
    total: T | None  # tree of float64 tensors, or None before the first add
    weight: float
    count: int
    # ``total`` is not this partial's own (another partial's, taken as is; or arrays Ray hands
    # over read-only): the next fold writes a new total instead of adding in place
    borrowed: bool = False
    memory: Memory | None = field(default=None, compare=False, repr=False)  # the first fold's (``placed``)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles ``total`` as numpy arrays, which Ray moves without a copy (a tensor is copied
        twice on each side); they arrive read-only, so the partial arrives borrowed."""
        arrays = None if self.total is None else tree_map(_as_array, self.total)
        return (_unpickled_sums, (arrays, self.weight, self.count))


def _as_array(t: torch.Tensor) -> Any:
    return t.numpy() if t.device.type == "cpu" else t  # a GPU tensor travels as torch ships it


def _unpickled_sums(arrays: Any, weight: float, count: int) -> _Sums[Any]:
    with warnings.catch_warnings():  # torch warns of read-only arrays; a borrowed total is never written
        warnings.simplefilter("ignore", UserWarning)
        total = tree_map(lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a, arrays)
    return _Sums(total, weight, count, borrowed=True)


def _merge_sums(left: _Sums[T], right: _Sums[T]) -> _Sums[T]:
    if left.total is None and right.total is not None:  # into zero: right's sums as they are, no copy
        return _Sums(right.total, left.weight + right.weight, left.count + right.count, borrowed=True)
    return _fold(left, right.total, 1.0, right.weight, right.count)


def _fold(acc: _Sums[T], update: T | None, scale: float, weight: float, count: int) -> _Sums[T]:
    """``acc`` plus ``scale * update`` (summed in float64) and ``weight`` and ``count``; the sums
    in place where ``acc`` owns them.

    Partials stay on the updates' device (a GPU worker copies one partial to the host per round,
    not one update per client); merging partials that arrive from workers happens on the CPU.
    """
    weight, count = acc.weight + weight, acc.count + count
    if update is None:
        return replace(acc, weight=weight, count=count)
    if acc.total is None:
        total = tree_map(lambda t: _scaled_copy(t.detach(), scale, acc.memory), update)
    elif acc.borrowed:
        total = tree_map(lambda a, t: torch.add(a, t.detach().to(a.device), alpha=scale), acc.total, update)
    else:
        total = tree_map(lambda a, t: a.add_(t.detach().to(a.device), alpha=scale), acc.total, update)
    return _Sums(total, weight, count)


def _scaled_copy(t: torch.Tensor, scale: float, memory: Memory | None) -> torch.Tensor:
    """``scale * t`` in a new float64 tensor: ``t`` converted (exactly) then multiplied in place,
    in ``memory`` where it offers room for a CPU tensor."""
    out = memory(t.shape, torch.float64) if memory is not None and t.device.type == "cpu" else None
    if out is None:
        return t.to(torch.float64, copy=True).mul_(scale)
    return out.copy_(t).mul_(scale)


def placed(partial: Partial, memory: Memory) -> Partial:
    """A zero ``partial`` whose sums the first fold writes into ``memory`` (a Ray worker's answer
    segment: the partial is then already where the driver reads it, ``shared_segments.pack``);
    the same partial where its aggregator keeps no float64 sums. The values are unchanged."""
    if isinstance(partial, _Sums) and partial.total is None:
        return replace(partial, memory=memory)
    return partial


class WeightedMean(Generic[T]):
    """Mean of ``update`` trees weighted by ``result.weight`` (uniform when ``weighted=False``).

    ``T`` is the updates' structure (``WeightedMean[Params]``); the mean has the same one.
    ``result`` returns ``None`` when no client contributed.
    """

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = weighted

    def zero(self) -> _Sums[T]:
        return _Sums(None, 0.0, 0)

    def add(self, acc: _Sums[T], position: int, result: ClientResult) -> _Sums[T]:
        w = float(result.weight) if self.weighted else 1.0
        update = cast(T, result.update)  # the plugin's clients send updates of this structure
        return _fold(acc, update, w, w, 1)

    def merge(self, left: _Sums[T], right: _Sums[T]) -> _Sums[T]:
        return _merge_sums(left, right)

    def result(self, acc: _Sums[T]) -> T | None:
        if acc.total is None or acc.weight == 0:
            return None
        return tree_map(lambda t: _divided(t, acc.weight), acc.total)

    def with_total_weight(self, acc: _Sums[T], weight: float) -> _Sums[T]:
        """``acc`` to be divided by ``weight``: central DP's fixed denominator (``raysim.private_sums``)."""
        return replace(acc, weight=weight)


def merged_result(aggregator: Aggregator[A_co], partials: Sequence[Partial]) -> A_co:
    """``result`` of ``partials`` merged in order (the driver's step after its workers report).

    A ``WeightedMean`` of partials on the CPU takes one pass that never holds the merged sums:
    each slice of each tensor is summed across the partials in order and divided into the
    float32 mean while in cache. The same additions of the same values in the same order, and
    the same division, so the same bits as ``merge`` then ``result``; a 1.6M-parameter model's
    mean no longer writes and reads 12.8 MB of float64 sums each round."""
    sums: list[_Sums[Any]] = (
        [p for p in partials if p.total is not None] if type(aggregator) is WeightedMean else []
    )
    on_cpu = bool(sums) and all(
        isinstance(t, torch.Tensor) and t.device.type == "cpu" for p in sums for t in leaves(p.total)
    )
    if not on_cpu:
        merged = aggregator.zero()
        for partial in partials:
            merged = aggregator.merge(merged, partial)
        return aggregator.result(merged)
    weight = 0.0
    for partial in partials:
        weight += partial.weight  # in order, as merging sums it
    if weight == 0:
        return cast(A_co, None)
    return cast(A_co, tree_map(lambda *ts: _mean_in_slices(ts, weight), *(p.total for p in sums)))


# elements: a slice's float64 sum (1 MiB) stays in cache and still splits over torch's threads
# (2**15 elements a thread); 2**15 or 2**21 were slower than the two passes on the 2-core VM
_SLICE = 1 << 17


def _mean_in_slices(totals: tuple[torch.Tensor, ...], weight: float) -> torch.Tensor:
    out = torch.empty(totals[0].shape, dtype=torch.float32)
    flat_out, flats = out.view(-1), [t.reshape(-1) for t in totals]
    for start in range(0, flat_out.numel(), _SLICE):
        part = slice(start, start + _SLICE)
        total = flats[0][part]
        if len(flats) > 1:  # as merging adds a partial: ``alpha=1.0``, into a new sum, then in place
            total = torch.add(total, flats[1][part], alpha=1.0)
            for other in flats[2:]:
                total.add_(other[part], alpha=1.0)
        torch.div(total, weight, out=flat_out[part])
    return out


def _divided(t: torch.Tensor, weight: float) -> torch.Tensor:
    """``(t / weight).to(float32)`` in one pass: divided in float64, rounded once on the store."""
    return torch.div(t, weight, out=torch.empty(t.shape, dtype=torch.float32, device=t.device))


class Sum(Generic[T]):
    """Plain sum of ``update`` trees of structure ``T`` (SCAFFOLD's weighted deltas and variate
    changes); None when empty."""

    def zero(self) -> _Sums[T]:
        return _Sums(None, 0.0, 0)

    def add(self, acc: _Sums[T], position: int, result: ClientResult) -> _Sums[T]:
        update = cast(T, result.update)  # the plugin's clients send updates of this structure
        return _fold(acc, update, 1.0, float(result.weight), 1)

    def merge(self, left: _Sums[T], right: _Sums[T]) -> _Sums[T]:
        return _merge_sums(left, right)

    def result(self, acc: _Sums[T]) -> T | None:
        if acc.total is None:
            return None
        return tree_map(lambda t: t.to(torch.float32), acc.total)


class Gather(Generic[R]):
    """Keeps every result with its cohort position, ordered by position (FuseFL composes blocks).

    ``R`` is the plugin's result type (``Gather[ClientResult[Upload, OwnModel]]``); ``result``
    returns ``[(position, result), ...]`` (``Gathered[R]``); a position indexes the round's cohort,
    so a plugin knows which client sent what even when failed clients were dropped.
    """

    def zero(self) -> Gathered[R]:
        return []

    def add(self, acc: Gathered[R], position: int, result: ClientResult) -> Gathered[R]:
        # copies: an update may be a view of the worker's resident model, which the next
        # client overwrites
        kept = cast(R, replace(result, update=tree_map(_own_copy, result.update)))  # the plugin's R
        return [*acc, (position, kept)]

    def merge(self, left: Gathered[R], right: Gathered[R]) -> Gathered[R]:
        return sorted([*left, *right], key=lambda item: item[0])

    def result(self, acc: Gathered[R]) -> Gathered[R]:
        return sorted(acc, key=lambda item: item[0])


def _own_copy(leaf: Any) -> Any:
    """A detached copy of a tensor leaf; other leaves (numbers, strings) are immutable already."""
    return leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf


def weighted_means(rows: Sequence[Metrics], weights: Sequence[float], skip: Collection[str] = ()) -> Metrics:
    """Every entry of the rows but ``skip``, averaged over the rows that carry it, each row weighted
    by its entry of ``weights`` (0 where those weights are all 0). A round's client metrics are
    averaged so, by client weight (``raysim.engine.metrics.client_means``);
    ``raysim.measure.pooling.pool_rows`` the means by examples."""
    keys = sorted({k for row in rows for k in row} - set(skip))
    out: Metrics = {}
    for key in keys:
        having = [(row[key], weight) for row, weight in zip(rows, weights, strict=True) if key in row]
        total = sum(weight for _, weight in having)
        out[key] = sum(value * weight for value, weight in having) / total if total else 0.0
    return out
