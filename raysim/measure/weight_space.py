"""Models as points in weight space: interpolation, convex mixtures, flattening and distance.

Models are ``NumpyParams`` dicts. Only floating-point entries take part; integer buffers
(BatchNorm's ``num_batches_tracked``) come from the first model. The float buffers (BatchNorm's
running statistics) can be recomputed by a rule of their own (``with_buffers``): the scans of
``raysim.measure.landscape`` never extrapolate them by default, where a running variance can turn
negative (Li et al., KDD 2025, arXiv:2402.18949).

Usage:
    w = interpolate(a, b, 0.25)                 # 0.25 a + 0.75 b
    fused = mix([w1, w2, w3], [120, 80, 200])   # weights normalised: data sizes work
    d = distance(w1, fused)                     # L2 of the flattened float entries (IMA's locality)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from raysim.types import NumpyParams

Weights = Sequence[float] | np.ndarray  # mixing weights, one per model
# The float buffers of a mixed point: mixed as the weights clamped to a convex combination, as
# the weights, or taken from the first model.
Buffers = Literal["clamp", "interpolate", "first"]


def is_float(value: np.ndarray) -> bool:
    """Whether an entry takes part in interpolation (weights, float buffers), not a counter."""
    return bool(np.issubdtype(np.asarray(value).dtype, np.floating))


def interpolate(a: NumpyParams, b: NumpyParams, alpha: float) -> NumpyParams:
    """``alpha * a + (1 - alpha) * b`` for every float entry; other entries from ``a``.

    ``alpha`` may leave [0, 1] (extrapolation, as IMA's Fig. 5 grid [-0.5, 1.5] does). Computed
    in float64, so ``interpolate(w, w, alpha)`` is ``w`` exactly, whatever the dtype.
    """
    return _combine([a, b], [alpha, 1.0 - alpha])


def mix(points: Sequence[NumpyParams], weights: Weights) -> NumpyParams:
    """The convex combination ``sum_k lam_k points[k]`` with ``lam = weights / sum(weights)``.

    The weights are normalised, so example counts can be passed as they are. Non-float entries
    come from ``points[0]``. Accumulates in float64, returns each entry in its own dtype.

    Raises:
        ValueError: no points, a weight per point missing, a negative weight, or all zero.
    """
    return _combine(points, simplex(weights, len(points)))


def _combine(points: Sequence[NumpyParams], coefficients: Weights) -> NumpyParams:
    """``sum_k c_k points[k]`` for float entries (accumulated in float64, returned in each entry's
    dtype); other entries from ``points[0]``."""
    check_same_keys(points)
    out: NumpyParams = {}
    for key, value in points[0].items():
        if not is_float(value):
            out[key] = value
            continue
        total = np.zeros(value.shape, dtype=np.float64)
        for c, point in zip(coefficients, points):
            total += c * np.asarray(point[key], dtype=np.float64)
        out[key] = total.astype(value.dtype)
    return out


def with_buffers(
    point: NumpyParams,
    models: Sequence[NumpyParams],
    coefficients: Weights,
    buffer_keys: frozenset[str],
    buffers: Buffers = "clamp",
) -> NumpyParams:
    """``point`` (the combination ``sum_k c_k models[k]`` with ``sum_k c_k = 1``) with its float
    buffers recomputed by the rule ``buffers`` (see ``Buffers``); other entries kept."""
    keys = [k for k in point if k in buffer_keys and is_float(point[k])]
    if not keys or buffers == "interpolate":
        return point
    c = np.asarray(coefficients, dtype=np.float64)
    if buffers == "first":
        c = np.eye(len(c))[0]
    else:  # clamp: at least one coefficient is positive, as they sum to 1
        c = np.clip(c, 0.0, None) / np.clip(c, 0.0, None).sum()
    mixed = _combine([{k: model[k] for k in keys} for model in models], c)
    return point | mixed


def flatten(params: NumpyParams) -> np.ndarray:
    """The float entries in sorted key order, as one float64 vector (ints are left out); sorted,
    so two models line up whatever their dicts' order."""
    parts = [np.asarray(params[k], dtype=np.float64).ravel() for k in sorted(params) if is_float(params[k])]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, like: NumpyParams) -> NumpyParams:
    """``flatten``'s inverse: float entries of ``like`` refilled from ``vector``, others kept."""
    out: NumpyParams = {}
    offset = 0
    for key in sorted(like):
        value = like[key]
        if is_float(value):
            size = value.size
            out[key] = vector[offset : offset + size].reshape(value.shape).astype(value.dtype)
            offset += size
        else:
            out[key] = value
    if offset != vector.size:
        raise ValueError(f"unflatten: the vector has {vector.size} values, the params {offset}")
    return {key: out[key] for key in like}


def distance(a: NumpyParams, b: NumpyParams) -> float:
    """The L2 distance of the flattened float entries (IMA's locality, Zhou et al., IEEE TMC 2024,
    arXiv:2305.07845)."""
    check_same_keys([a, b])
    return float(np.linalg.norm(flatten(a) - flatten(b)))


def simplex(weights: Weights, count: int) -> np.ndarray:
    """``weights`` normalised to sum to 1 (``mix``'s ``lam``), checked to be a convex combination."""
    lam = np.asarray(weights, dtype=np.float64)
    if count == 0:
        raise ValueError("mix: no points to combine")
    if lam.shape != (count,):
        raise ValueError(f"mix: {count} points need {count} weights, got shape {lam.shape}")
    if (lam < 0).any() or lam.sum() <= 0:
        raise ValueError(f"mix: weights must be >= 0 with a positive sum (a convex combination), got {lam}")
    return lam / lam.sum()


def check_same_keys(points: Sequence[NumpyParams]) -> None:
    """Raises ValueError unless every model has the entries of the first (one architecture)."""
    keys = set(points[0])
    for i, point in enumerate(points[1:], start=1):
        if set(point) != keys:
            diff = sorted(keys ^ set(point))[:5]
            raise ValueError(
                f"model {i} has other entries than model 0 (differing: {diff}); same architecture?"
            )
