"""User-level DP on an aggregator's sums: one client moves the released aggregate by at most a bound.

The law (DP-FedAvg: McMahan et al., ICLR 2018, arXiv:1710.06963, Algorithm 1 with its fixed
denominator): a client's *contribution* is what the plugin's aggregator sums for it alone (its
``add`` into an empty partial: the delta for FedAvg; FedFish's ``F * delta``, ``F`` and ``delta``).
On its worker, every summed tensor of it is scaled by ``weight * min(1, clip_bound / norm)``, the L2
norm taken jointly over all of them and ``weight`` 1, or ``min(examples / weight_cap, 1)``; the
partials merge as before; then, once and on the driver, Gaussian noise is added to each summed
coordinate, and the result divides by a fixed ``denominator`` (the expected total weight) instead
of the weight that arrived. So the noised sums move by at most ``clip_bound`` when a client joins or
leaves, whatever its data, and how clients were spread over workers changes nothing: clipping is
per client, the noise is drawn once, after the merge.

An aggregator takes part by saying how its result divides (``Summing.with_total_weight``):
``WeightedMean`` and FedFish's ``FisherWeightedMean`` do. ``Sum`` does not (its plugins fold
data-dependent weights into their updates and divide by them), nor ``Gather``.

Usage:
    clipped = ClippedSums(WeightedMean(), ClientClipping(clip_bound=0.5))  # on every worker
    acc = clipped.add(clipped.zero(), 0, result); ...   # then merged as any partial
    noise = [0.5 * draw for draw in gaussian_draws(acc.sums, torch.Generator().manual_seed(seed))]
    mean_delta = released(WeightedMean(), add_noise(acc.sums, noise), denominator=10.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import torch

from raysim import params as P
from raysim.aggregate import Partial, Summing
from raysim.params import tree_map
from raysim.types import ClientResult

A = TypeVar("A")


@dataclass(frozen=True)
class ClientClipping:
    """What the workers need of a round's central DP: the clip bound (it adapts between rounds)
    and the weights' cap. The noise and the denominator stay on the driver."""

    clip_bound: float
    weight_cap: int | None = None  # examples at which a client weighs 1; None: every client weighs 1


@dataclass(frozen=True)
class PrivatePartial:
    """A partial of clipped contributions, and how many of them were within the bound (adaptive
    clipping's count, released only with its own noise)."""

    sums: Partial  # the plugin aggregator's own partial
    num_within_bound: int | torch.Tensor  # a 0-dim tensor once a client is added
    num_clients: int


def client_weight(examples: float, weight_cap: int | None) -> float:
    """1, or ``min(examples / weight_cap, 1)`` (McMahan et al.'s capped weight ``w_k``)."""
    return 1.0 if weight_cap is None else min(float(examples) / weight_cap, 1.0)


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], tree: Any) -> Any:
    """``fn`` on each floating-point tensor of ``tree``; other leaves (weights, counts) unchanged."""
    return tree_map(
        lambda leaf: fn(leaf) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() else leaf, tree
    )


class ClippedSums(Generic[A]):
    """The round's aggregator under central DP: ``inner``'s partials of clipped contributions.

    ``result`` returns the merged ``PrivatePartial`` itself: the driver releases it (``noised``,
    then ``released``), never a worker.
    """

    def __init__(self, inner: Summing[A], clipping: ClientClipping) -> None:
        self.inner = inner
        self.clipping = clipping

    def zero(self) -> PrivatePartial:
        return PrivatePartial(self.inner.zero(), 0, 0)

    def add(self, acc: PrivatePartial, position: int, result: ClientResult) -> PrivatePartial:
        one = self.inner.add(self.inner.zero(), position, replace(result, weight=1.0))
        norm, bound = P.tree_norm(one), self.clipping.clip_bound  # read by nobody on the worker
        scale = P.clip_factor(norm, bound) * client_weight(result.weight, self.clipping.weight_cap)
        clipped = map_tensors(lambda t: t * scale.to(t.device, t.dtype), one)  # not in place: views
        within = (norm <= bound).long()  # a tensor: counted without a host read
        return PrivatePartial(
            self.inner.merge(acc.sums, clipped), acc.num_within_bound + within, acc.num_clients + 1
        )

    def merge(self, left: PrivatePartial, right: PrivatePartial) -> PrivatePartial:
        return PrivatePartial(
            self.inner.merge(left.sums, right.sums),
            left.num_within_bound + right.num_within_bound,
            left.num_clients + right.num_clients,
        )

    def result(self, acc: PrivatePartial) -> PrivatePartial:
        return acc


def gaussian_draws(sums: Partial, generator: torch.Generator) -> list[torch.Tensor]:
    """One standard normal tensor per floating-point tensor of ``sums``, in float64 on the CPU."""
    return [torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in P.float_leaves(sums)]


def add_noise(sums: Partial, noise: list[torch.Tensor]) -> Partial:
    """``sums`` with ``noise`` (one tensor per floating-point tensor, in ``P.float_leaves``' order) added."""
    shapes = [tuple(t.shape) for t in P.float_leaves(sums)]
    if shapes != [tuple(n.shape) for n in noise]:
        raise ValueError(
            f"noise of shapes {[tuple(n.shape) for n in noise][:3]}... for sums of {shapes[:3]}..."
        )
    draws = iter(noise)
    return map_tensors(lambda t: t + next(draws).to(t.device, t.dtype), sums)


def released(aggregator: Summing[A], sums: Partial, denominator: float) -> A:
    """The aggregate the plugin's server step receives: its result over the fixed denominator."""
    return aggregator.result(aggregator.with_total_weight(sums, denominator))
