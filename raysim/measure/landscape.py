"""Connectivity and loss-landscape scans: barriers along lines, the group barrier, planes.

Every scan turns its parameter points into ONE ``Services.map_clients`` call, so the grid is
spread over all workers (``raysim.measure.points``); ``clients=None`` evaluates on the dataset's
central test set, a list of clients on their data (rows combined weighted by ``num_examples``).
The arithmetic on the points is ``raysim.measure.weight_space``'s, the plots
``raysim.measure.landscape_plots``'.

Sources:
- Pairwise barriers: FedGuCci, Li et al., "FedGuCci: Making Local Models More Connected in
  Landscape for Federated Learning", KDD 2025, arXiv:2402.18949, Def. 2.1 (eq. 3-4):
  ``B_loss = max_a [L(w(a)) - (a L(w1) + (1-a) L(w2))]``,
  ``B_acc = max_a [1 - A(w(a)) / (a A(w1) + (1-a) A(w2))]`` with ``w(a) = a w1 + (1-a) w2``.
- Group barrier: the same paper, Def. 3.6 (eq. 9-10): ``B_loss = L(sum_k lam_k w_k) -
  sum_k lam_k L(w_k)``, ``B_acc = 1 - A(sum_k lam_k w_k) / sum_k lam_k A(w_k)``.
- The plane through three models (Garipov et al., NeurIPS 2018, arXiv:1802.10026) as IMA draws
  it: Zhou et al., "Understanding and Improving Model Averaging in Federated Learning on
  Heterogeneous Data", IEEE TMC 2024, arXiv:2305.07845.

The scans treat the float buffers (``RunInfo.buffer_keys``: BatchNorm's running statistics) by
their ``buffers`` keyword (``raysim.measure.weight_space.Buffers``): by default (``"clamp"``) with the
point's mixing weights clamped to a convex combination (negatives set to 0, renormalised), so they
are interpolated between the models and never extrapolated past them, where a running variance
can turn negative and the loss NaN; ``"interpolate"`` treats them as the weights are treated,
``"first"`` takes them from the first model (a, w1) everywhere. Interpolating BatchNorm networks
without recomputing their statistics measures the stale statistics too (Li et al., KDD 2025,
arXiv:2402.18949).

Usage:
    curve = line_scan(services, w_a, w_b, alphas=np.linspace(0, 1, 11))
    print(loss_barrier(curve), accuracy_barrier(curve))
    scan = plane_scan(services, w1, w2, w3, size=21, labels=("round 98", "round 99", "round 100"))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from raysim.measure.points import Values, evaluate_in_calls, evaluate_points
from raysim.measure.weight_space import (
    Buffers,
    Weights,
    check_same_keys,
    flatten,
    interpolate,
    mix,
    simplex,
    unflatten,
    with_buffers,
)
from raysim.services import Services
from raysim.types import NumpyParams

BARRIERS = ("loss_barrier", "accuracy_barrier")  # group_barrier's barrier keys (their _max too)


def _others(values: Values) -> Values:
    """The metrics besides loss and accuracy (the dataset's scores, perplexity)."""
    return {name: v for name, v in values.items() if name not in ("loss", "accuracy")}


# ---- pairwise barriers (FedGuCci Def. 2.1) ----------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """Loss and accuracy along ``w(alpha) = alpha * a + (1 - alpha) * b``: ``alpha = 1`` is ``a``.

    ``accuracy`` is None for a task without one (regression); ``scores`` holds the other metrics
    per alpha (the dataset's MCC, F1 or Pearson, a causal LM's perplexity).
    """

    alphas: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray | None = None
    scores: Values = field(default_factory=dict)


def line_scan(
    services: Services[object],
    a: NumpyParams,
    b: NumpyParams,
    alphas: np.ndarray | Sequence[float] = np.linspace(0, 1, 11),
    clients: Sequence[int] | np.ndarray | None = None,
    split: str = "test",
    *,
    round_num: int | None = None,
    buffers: Buffers = "clamp",
    points_per_call: int | None = None,
) -> Curve:
    """Evaluates ``interpolate(a, b, alpha)`` for every alpha (one ``map_clients`` call, or
    several of ``points_per_call`` points; by default as many as fit in ``SCAN_BYTES_PER_CALL``).

    The float buffers (``services.info.buffer_keys``) follow ``buffers``: by default
    ``interpolate(a, b, clip(alpha, 0, 1))``, so each endpoint keeps its own statistics and an
    extrapolated point those of the nearer model. We take 11 points in [0, 1] for barriers and
    21 for plots (the FedGuCci paper gives no grid); IMA's 1-D plots use [-0.5, 1.5] in steps of 0.05
    (Zhou et al., IEEE TMC 2024, arXiv:2305.07845).
    """
    grid = np.array(alphas, dtype=np.float64)  # a copy: the Curve owns it
    keys = services.info.buffer_keys

    def point(i: int) -> NumpyParams:
        alpha = float(grid[i])
        return with_buffers(interpolate(a, b, alpha), [a, b], [alpha, 1.0 - alpha], keys, buffers)

    values = evaluate_in_calls(
        services, point, len(grid), clients, split, round_num=round_num, points_per_call=points_per_call
    )
    return Curve(grid, values["loss"], values.get("accuracy"), _others(values))


def _endpoints(curve: Curve) -> tuple[np.ndarray, int, int]:
    """Indices of the alphas in [0, 1] and of alpha 1 (model a) and alpha 0 (model b)."""
    alphas = np.asarray(curve.alphas)
    ones, zeros = np.flatnonzero(np.isclose(alphas, 1.0)), np.flatnonzero(np.isclose(alphas, 0.0))
    if not len(ones) or not len(zeros):
        raise ValueError("a barrier needs the endpoints alpha=0 and alpha=1 in the curve's alphas")
    inside = np.flatnonzero((alphas >= -1e-12) & (alphas <= 1 + 1e-12))
    return inside, int(ones[0]), int(zeros[0])


def loss_barrier(curve: Curve) -> float:
    """``max_a [L(w(a)) - (a L(w1) + (1-a) L(w2))]`` over the alphas in [0, 1] (FedGuCci eq. 3).

    At least 0 (the endpoints score 0); unbounded above.
    """
    inside, one, zero = _endpoints(curve)
    alphas, loss = curve.alphas[inside], curve.loss[inside]
    linear = alphas * curve.loss[one] + (1 - alphas) * curve.loss[zero]
    return float(np.max(loss - linear))


def accuracy_barrier(curve: Curve, *, reading: Literal["paper", "fedgucci_code"] = "paper") -> float:
    """The accuracy barrier (FedGuCci eq. 4), in [0, 1]; 0 where the line loses nothing.

    ``paper``: ``max_a [1 - A(w(a)) / (a A(w1) + (1-a) A(w2))]``.
    ``fedgucci_code`` (the authors' ``calculate_barrier_and_stats``): the alpha with the largest
    ``d(a) = linear(a) - A(w(a))``, reported as ``d / linear`` there; nearly the same number.
    Where the linear accuracy is 0 there is nothing to lose and the term counts as 0.

    Raises:
        ValueError: the curve has no accuracy (a regression task) or lacks an endpoint.
    """
    if curve.accuracy is None:
        raise ValueError("accuracy_barrier: the curve has no accuracy (a regression task): use loss_barrier")
    inside, one, zero = _endpoints(curve)
    alphas, accuracy = curve.alphas[inside], curve.accuracy[inside]
    linear = alphas * curve.accuracy[one] + (1 - alphas) * curve.accuracy[zero]
    if reading == "fedgucci_code":
        drop = linear - accuracy
        worst = int(np.argmax(drop))
        return float(drop[worst] / linear[worst]) if linear[worst] > 0 and drop[worst] > 0 else 0.0
    ratio = np.divide(accuracy, linear, out=np.ones_like(linear), where=linear > 0)
    return float(np.max(1 - ratio))  # the endpoints score 0, so the max is in [0, 1]


# ---- group barrier (FedGuCci Def. 3.6) ---------------------------------------------------------


def group_barrier(
    services: Services[object],
    models: Sequence[NumpyParams],
    weights: Weights | None = None,
    clients: Sequence[int] | np.ndarray | None = None,
    split: str = "test",
    *,
    round_num: int | None = None,
    samples: int = 0,
    seed: int | Sequence[int] = 0,
) -> dict[str, float]:
    """The group barrier of ``models`` at ``lam`` (FedGuCci Def. 3.6, eq. 9-10):

        loss_barrier     = L(sum_k lam_k w_k) - sum_k lam_k L(w_k)            (absolute)
        accuracy_barrier = 1 - A(sum_k lam_k w_k) / sum_k lam_k A(w_k)        (relative)

    ``lam`` is uniform (1/K, the FedAvg fusion point) or ``weights`` normalised (data sizes).
    Unlike a pairwise barrier these are signed: a fused model better than its members gives a
    negative barrier. With ``samples > 0`` also the Monte-Carlo max over that many
    Dirichlet(1) draws of ``lam`` (seeded; our choice for the sup reading of FedGuCci paper, Sec. 3.2):
    ``loss_barrier_max``, ``accuracy_barrier_max``. Every model, the fusion and the draws are
    evaluated in one ``map_clients`` call.

    Returns:
        ``loss_barrier``, ``accuracy_barrier``, ``fused_loss``, ``fused_accuracy``,
        ``mean_local_loss``, ``mean_local_accuracy`` (lam-weighted), and the ``_max`` pair; no
        accuracy terms for a task without accuracy (regression); ``fused_<score>`` and
        ``mean_local_<score>`` for the dataset's scores (MCC, F1, Pearson).
    """
    count = len(models)
    lam = simplex(np.ones(count) if weights is None else weights, count)
    draws = np.random.default_rng(seed).dirichlet(np.ones(count), size=samples)
    fusions = [mix(models, lam), *(mix(models, d) for d in draws)]
    values = evaluate_points(services, [*models, *fusions], clients, split, round_num=round_num)
    own = {name: v[:count] for name, v in values.items()}

    def terms(weights: np.ndarray, point: int) -> dict[str, float]:
        return _group_terms(weights, own, {name: float(v[point]) for name, v in values.items()})

    out = terms(lam, count)
    if samples:
        sampled = [terms(d, count + 1 + i) for i, d in enumerate(draws)]
        out |= {f"{name}_max": max(s[name] for s in sampled) for name in BARRIERS if name in out}
    return out


def _group_terms(lam: np.ndarray, own: Values, fused: dict[str, float]) -> dict[str, float]:
    """The barriers at ``lam`` from the members' metrics ``own`` and the fusion's ``fused``."""
    mean = {name: float(lam @ v) for name, v in own.items()}
    out = {"loss_barrier": fused["loss"] - mean["loss"]}
    if "accuracy" in mean:
        accuracy = mean["accuracy"]
        out["accuracy_barrier"] = 1.0 - fused["accuracy"] / accuracy if accuracy > 0 else 0.0
    return (
        out
        | {f"fused_{name}": value for name, value in fused.items()}
        | {f"mean_local_{name}": value for name, value in mean.items()}
    )


# ---- the plane through three models (Zhou et al., IEEE TMC 2024, arXiv:2305.07845) -------------


@dataclass(frozen=True)
class Plane:
    """The plane through three models: ``w(x, y) = w1 + x u + y v`` with orthonormal ``u, v``.

    Gram-Schmidt on the flattened float params: ``u = (w2 - w1) / ||w2 - w1||``, ``v`` the unit
    component of ``w3 - w1`` orthogonal to ``u``. So w1 sits at (0, 0), w2 at (||w2 - w1||, 0),
    w3 at (<w3 - w1, u>, <w3 - w1, v>).
    """

    origin: NumpyParams
    u: np.ndarray
    v: np.ndarray
    coords: np.ndarray  # (3, 2): w1, w2, w3 in plane coordinates

    @classmethod
    def through(cls, w1: NumpyParams, w2: NumpyParams, w3: NumpyParams) -> Plane:
        """The plane through three models of one architecture.

        Raises:
            ValueError: w1 and w2 coincide, or w3 lies on their line (no plane).
        """
        check_same_keys([w1, w2, w3])
        origin = flatten(w1)
        du, dw = flatten(w2) - origin, flatten(w3) - origin
        norm_u = float(np.linalg.norm(du))
        if norm_u == 0:
            raise ValueError("Plane.through: w1 and w2 are the same point; pass three distinct models")
        u = du / norm_u
        ortho = dw - (dw @ u) * u
        norm_v = float(np.linalg.norm(ortho))
        if norm_v <= 1e-12 * max(norm_u, float(np.linalg.norm(dw))):
            raise ValueError("Plane.through: w3 lies on the line through w1 and w2; pick another w3")
        v = ortho / norm_v
        coords = np.array([[0.0, 0.0], [norm_u, 0.0], [dw @ u, dw @ v]])
        return cls(origin=w1, u=u, v=v, coords=coords)

    @cached_property
    def _flat_origin(self) -> np.ndarray:  # flattened once, not once per grid point
        return flatten(self.origin)

    def point(self, x: float, y: float) -> NumpyParams:
        """The model at plane coordinates (x, y); non-float entries from w1."""
        return unflatten(self._flat_origin + x * self.u + y * self.v, self.origin)

    def barycentric(self, x: float, y: float) -> np.ndarray:
        """``(l1, l2, l3)``, summing to 1, with ``point(x, y) = l1 w1 + l2 w2 + l3 w3``; all in
        [0, 1] inside the triangle of the three models."""
        corners = np.vstack([self.coords.T, np.ones(3)])  # (3, 3): x row, y row, ones
        return np.asarray(np.linalg.solve(corners, np.array([x, y, 1.0])))

    def grid(self, size: int = 21, padding: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
        """``size`` evenly spaced x and y values covering the three models' bounding box, widened
        by ``padding`` times its extent on each side (20-50% frames plots like the IMA paper's, Sec. 3.2)."""
        if size < 2:
            raise ValueError(f"Plane.grid: size must be >= 2, got {size}")
        low, high = self.coords.min(axis=0), self.coords.max(axis=0)
        margin = padding * (high - low)
        xs = np.linspace(low[0] - margin[0], high[0] + margin[0], size)
        ys = np.linspace(low[1] - margin[1], high[1] + margin[1], size)
        return xs, ys


@dataclass(frozen=True)
class PlaneScan:
    """Loss and accuracy on a plane's grid: ``loss[i, j]`` at ``(xs[j], ys[i])`` (matplotlib's
    ``contour(xs, ys, loss)`` layout); ``coords`` and ``labels`` of the three models.
    ``accuracy`` is None for a task without one (regression); ``scores`` holds the other metrics
    on the grid (the dataset's MCC, F1 or Pearson, a causal LM's perplexity)."""

    xs: np.ndarray
    ys: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray | None
    coords: np.ndarray
    labels: tuple[str, str, str]
    scores: Values = field(default_factory=dict)


def plane_scan(
    services: Services[object],
    w1: NumpyParams,
    w2: NumpyParams,
    w3: NumpyParams,
    size: int = 21,
    padding: float = 0.3,
    clients: Sequence[int] | np.ndarray | None = None,
    split: str = "test",
    labels: tuple[str, str, str] = ("w1", "w2", "w3"),
    *,
    round_num: int | None = None,
    buffers: Buffers = "clamp",
    points_per_call: int | None = None,
) -> PlaneScan:
    """Loss and accuracy on a ``size`` x ``size`` grid of the plane through w1, w2, w3.

    The grid goes to ``map_clients`` ``points_per_call`` points at a time: by default as many
    as fit in ``SCAN_BYTES_PER_CALL`` (441 copies of an 11M-parameter model would take 19 GB).
    The float buffers (``services.info.buffer_keys``) follow ``buffers``: by default the point's
    barycentric weights clamped to the triangle of the three models, so each model keeps its own
    statistics and no point extrapolates them.
    """
    plane = Plane.through(w1, w2, w3)
    xs, ys = plane.grid(size, padding)
    coords = [(x, y) for y in ys for x in xs]  # row-major: row i is ys[i]
    keys = services.info.buffer_keys

    def point(i: int) -> NumpyParams:
        x, y = coords[i]
        return with_buffers(plane.point(x, y), [w1, w2, w3], plane.barycentric(x, y), keys, buffers)

    values = evaluate_in_calls(
        services, point, len(coords), clients, split, round_num=round_num, points_per_call=points_per_call
    )
    grid = {name: v.reshape(len(ys), len(xs)) for name, v in values.items()}
    return PlaneScan(xs, ys, grid["loss"], grid.get("accuracy"), plane.coords, labels, _others(grid))
