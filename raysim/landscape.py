"""Connectivity and loss-landscape analysis: interpolation, barriers, planes, and their plots.

Every scan turns its parameter points into ONE ``Services.map_clients("evaluate", ...)`` call, so
the grid is spread over all workers; ``clients=None`` evaluates on the dataset's central test set,
a list of clients on their data (rows combined weighted by ``num_examples``).

Sources:
- Pairwise barriers: FedGuCci, Li et al., "FedGuCci: Making Local Models More Connected in
  Landscape for Federated Learning", KDD 2025, arXiv:2402.18949, Def. 2.1 (eq. 3-4);
  notes/fedgucci.md section 4: ``B_loss = max_a [L(w(a)) - (a L(w1) + (1-a) L(w2))]``,
  ``B_acc = max_a [1 - A(w(a)) / (a A(w1) + (1-a) A(w2))]`` with ``w(a) = a w1 + (1-a) w2``.
- Group barrier: the same paper, Def. 3.6 (eq. 9-10): ``B_loss = L(sum_k lam_k w_k) -
  sum_k lam_k L(w_k)``, ``B_acc = 1 - A(sum_k lam_k w_k) / sum_k lam_k A(w_k)``.
- The plane through three models (Garipov et al., NeurIPS 2018, arXiv:1802.10026) as IMA draws
  it: Zhou et al., "Understanding and Improving Model Averaging in Federated Learning on
  Heterogeneous Data", IEEE TMC 2024, arXiv:2305.07845; notes/ima.md section 3.1.
- Linear CKA (Kornblith et al., ICML 2019, arXiv:1905.00414), IMA's covariance measure
  (notes/ima.md section 3.3).

Only floating-point entries are interpolated; integer buffers (BatchNorm's
``num_batches_tracked``) are taken from the first model. The scans treat the float buffers
(``RunInfo.buffer_keys``: BatchNorm's running statistics) by their ``buffers`` keyword: by
default (``"clamp"``) with the point's mixing weights clamped to a convex combination (negatives
set to 0, renormalised), so they are interpolated between the models and never extrapolated past
them, where a running variance can turn negative and the loss NaN; ``"interpolate"`` treats them
as the weights are treated, ``"first"`` takes them from the first model (a, w1) everywhere.
Interpolating BatchNorm networks without recomputing their statistics measures the stale
statistics too (notes/fedgucci.md section 4).

Usage:
    curve = line_scan(services, w_a, w_b, alphas=np.linspace(0, 1, 11))
    print(loss_barrier(curve), accuracy_barrier(curve))
    plot_curve(curve, "interp.png", title="FedAvg: client 3 vs client 7")
    scan = plane_scan(services, w1, w2, w3, size=21, labels=("round 98", "round 99", "round 100"))
    plot_plane(scan, "plane.png")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

import numpy as np

from raysim.services import Services
from raysim.types import Metrics, NumpyParams

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Weights = Sequence[float] | np.ndarray  # mixing weights, one per model
# The float buffers of a scanned point (see the module docstring): mixed as the weights clamped
# to a convex combination, as the weights, or taken from the first model.
Buffers = Literal["clamp", "interpolate", "first"]
# What one ``map_clients`` call of a scan may hold in parameter points, unless told otherwise
SCAN_BYTES_PER_CALL = 1 << 30

# ---- parameter arithmetic --------------------------------------------------------------------


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
    return _combine(points, _simplex(weights, len(points)))


def _combine(points: Sequence[NumpyParams], coefficients: Weights) -> NumpyParams:
    """``sum_k c_k points[k]`` for float entries (accumulated in float64, returned in each entry's
    dtype); other entries from ``points[0]``."""
    _check_same_keys(points)
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
    """The L2 distance of the flattened float entries (IMA's locality, notes/ima.md 3.3)."""
    _check_same_keys([a, b])
    return float(np.linalg.norm(flatten(a) - flatten(b)))


def _simplex(weights: Weights, count: int) -> np.ndarray:
    lam = np.asarray(weights, dtype=np.float64)
    if count == 0:
        raise ValueError("mix: no points to combine")
    if lam.shape != (count,):
        raise ValueError(f"mix: {count} points need {count} weights, got shape {lam.shape}")
    if (lam < 0).any() or lam.sum() <= 0:
        raise ValueError(f"mix: weights must be >= 0 with a positive sum (a convex combination), got {lam}")
    return lam / lam.sum()


def _check_same_keys(points: Sequence[NumpyParams]) -> None:
    keys = set(points[0])
    for i, point in enumerate(points[1:], start=1):
        if set(point) != keys:
            diff = sorted(keys ^ set(point))[:5]
            raise ValueError(
                f"model {i} has other entries than model 0 (differing: {diff}); same architecture?"
            )


# ---- evaluation through the engine ----------------------------------------------------------


def evaluate_points(
    services: Services[object],
    points: Sequence[NumpyParams],
    clients: Sequence[int] | np.ndarray | None = None,
    split: str = "test",
    *,
    round_num: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy of every point, in one ``map_clients`` call spread over the workers.

    ``clients`` None: the central test set; else the clients' ``split`` data, pooled: each
    point's per-client rows weighted by their ``num_examples``.

    Raises:
        NoExamplesError: the dataset has no central test set, or the clients have no data in
            ``split``.
    """
    results = services.map_clients("evaluate", list(points), clients, split=split, round_num=round_num)
    pooled = [_pool(rows) for rows in results]
    if any(row is None for row in pooled):
        raise NoExamplesError(clients, split)
    loss = np.array([row["loss"] for row in pooled if row is not None])
    accuracy = np.array([row["accuracy"] for row in pooled if row is not None])
    return loss, accuracy


def evaluate_in_calls(
    services: Services[object],
    make_point: Callable[[int], NumpyParams],
    count: int,
    clients: Sequence[int] | np.ndarray | None,
    split: str,
    *,
    round_num: int | None,
    points_per_call: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``evaluate_points`` of ``make_point(0..count-1)``, built and sent ``points_per_call`` at a
    time (default: as many as fit in ``SCAN_BYTES_PER_CALL``), so a large grid of a large model
    never sits in memory all at once."""
    if count == 0:
        raise ValueError("a scan needs at least one point to evaluate")
    first = make_point(0)
    step = points_per_call or max(1, SCAN_BYTES_PER_CALL // max(1, _num_bytes(first)))
    loss, accuracy = [], []
    for start in range(0, count, step):
        points = [first if i == 0 else make_point(i) for i in range(start, min(start + step, count))]
        part_loss, part_accuracy = evaluate_points(services, points, clients, split, round_num=round_num)
        loss.append(part_loss)
        accuracy.append(part_accuracy)
    return np.concatenate(loss), np.concatenate(accuracy)


def _num_bytes(params: NumpyParams) -> int:
    return sum(np.asarray(v).nbytes for v in params.values())


class NoExamplesError(ValueError):
    """The data a scan was asked to evaluate on is empty (often: no central test set)."""

    def __init__(self, clients: Sequence[int] | np.ndarray | None, split: str) -> None:
        self.central = clients is None
        where = (
            "the central test set (the dataset has none: pass clients)"
            if clients is None
            else f"split {split!r} of clients {[int(c) for c in clients][:8]}"
        )
        super().__init__(f"no examples to evaluate on in {where}")


def _pool(rows: Sequence[Metrics | None]) -> Metrics | None:
    """Per-client rows as one row of their pooled examples (None if none has examples)."""
    kept = [row for row in rows if row is not None and row.get("num_examples", 0) > 0]
    if not kept:
        return None
    n = np.array([row["num_examples"] for row in kept])
    pooled = {key: float(np.dot(n, [row[key] for row in kept]) / n.sum()) for key in ("loss", "accuracy")}
    return pooled | {"num_examples": float(n.sum())}


# ---- pairwise barriers (FedGuCci Def. 2.1) ----------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """Loss and accuracy along ``w(alpha) = alpha * a + (1 - alpha) * b``: ``alpha = 1`` is ``a``."""

    alphas: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray


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
    extrapolated point those of the nearer model. FedGuCci's notes recommend 11 points in
    [0, 1] for barriers and 21 for plots; IMA's 1-D plots use [-0.5, 1.5] in steps of 0.05
    (notes/ima.md section 3.1).
    """
    grid = np.array(alphas, dtype=np.float64)  # a copy: the Curve owns it
    keys = services.info.buffer_keys

    def point(i: int) -> NumpyParams:
        alpha = float(grid[i])
        return with_buffers(interpolate(a, b, alpha), [a, b], [alpha, 1.0 - alpha], keys, buffers)

    loss, accuracy = evaluate_in_calls(
        services, point, len(grid), clients, split, round_num=round_num, points_per_call=points_per_call
    )
    return Curve(grid, loss, accuracy)


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


def accuracy_barrier(curve: Curve, *, variant: Literal["paper", "code"] = "paper") -> float:
    """The accuracy barrier (FedGuCci eq. 4), in [0, 1]; 0 where the line loses nothing.

    ``paper``: ``max_a [1 - A(w(a)) / (a A(w1) + (1-a) A(w2))]``.
    ``code`` (the authors' ``calculate_barrier_and_stats``): the alpha with the largest
    ``d(a) = linear(a) - A(w(a))``, reported as ``d / linear`` there; nearly the same number.
    Where the linear accuracy is 0 there is nothing to lose and the term counts as 0.
    """
    inside, one, zero = _endpoints(curve)
    alphas, accuracy = curve.alphas[inside], curve.accuracy[inside]
    linear = alphas * curve.accuracy[one] + (1 - alphas) * curve.accuracy[zero]
    if variant == "code":
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

        loss     = L(sum_k lam_k w_k) - sum_k lam_k L(w_k)
        accuracy = 1 - A(sum_k lam_k w_k) / sum_k lam_k A(w_k)

    ``lam`` is uniform (1/K, the FedAvg fusion point) or ``weights`` normalised (data sizes).
    Unlike a pairwise barrier these are signed: a fused model better than its members gives a
    negative barrier. With ``samples > 0`` also the Monte-Carlo max over that many
    Dirichlet(1) draws of ``lam`` (seeded; the notes' recommendation for the sup reading):
    ``loss_max``, ``accuracy_max``. Every model, the fusion and the draws are evaluated in one
    ``map_clients`` call.

    Returns:
        ``loss``, ``accuracy`` (the barriers), ``fused_loss``, ``fused_accuracy``,
        ``mean_local_loss``, ``mean_local_accuracy`` (lam-weighted), and the ``_max`` pair.
    """
    count = len(models)
    lam = _simplex(np.ones(count) if weights is None else weights, count)
    draws = np.random.default_rng(seed).dirichlet(np.ones(count), size=samples)
    fusions = [mix(models, lam), *(mix(models, d) for d in draws)]
    loss, accuracy = evaluate_points(services, [*models, *fusions], clients, split, round_num=round_num)
    own_loss, own_accuracy = loss[:count], accuracy[:count]
    out = _group_terms(lam, own_loss, own_accuracy, loss[count], accuracy[count])
    if samples:
        sampled = [
            _group_terms(d, own_loss, own_accuracy, loss[count + 1 + i], accuracy[count + 1 + i])
            for i, d in enumerate(draws)
        ]
        out["loss_max"] = max(s["loss"] for s in sampled)
        out["accuracy_max"] = max(s["accuracy"] for s in sampled)
    return out


def _group_terms(
    lam: np.ndarray, loss: np.ndarray, accuracy: np.ndarray, fused_loss: float, fused_accuracy: float
) -> dict[str, float]:
    mean_loss, mean_accuracy = float(lam @ loss), float(lam @ accuracy)
    return {
        "loss": float(fused_loss) - mean_loss,
        "accuracy": 1.0 - float(fused_accuracy) / mean_accuracy if mean_accuracy > 0 else 0.0,
        "fused_loss": float(fused_loss),
        "fused_accuracy": float(fused_accuracy),
        "mean_local_loss": mean_loss,
        "mean_local_accuracy": mean_accuracy,
    }


# ---- the plane through three models (notes/ima.md section 3.1) ---------------------------------


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
        _check_same_keys([w1, w2, w3])
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
        by ``padding`` times its extent on each side (IMA's notes suggest 20-50%)."""
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
    ``contour(xs, ys, loss)`` layout); ``coords`` and ``labels`` of the three models."""

    xs: np.ndarray
    ys: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    coords: np.ndarray
    labels: tuple[str, str, str]


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

    loss, accuracy = evaluate_in_calls(
        services, point, len(coords), clients, split, round_num=round_num, points_per_call=points_per_call
    )
    shape = (len(ys), len(xs))
    return PlaneScan(
        xs=xs,
        ys=ys,
        loss=loss.reshape(shape),
        accuracy=accuracy.reshape(shape),
        coords=plane.coords,
        labels=labels,
    )


# ---- plots (matplotlib, headless) --------------------------------------------------------------


def plot_curve(curve: Curve, path: str | Path, title: str = "") -> Path:
    """Loss and accuracy against alpha, with both barriers in the legend when the curve spans
    [0, 1]; returns ``path`` (a PNG)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    try:
        barriers = {"loss": loss_barrier(curve), "accuracy": accuracy_barrier(curve)}
    except ValueError:  # a grid without both endpoints has no barrier
        barriers = {}
    for ax, name, values in ((axes[0], "loss", curve.loss), (axes[1], "accuracy", curve.accuracy)):
        label = f"barrier {barriers[name]:.4g}" if name in barriers else name
        ax.plot(curve.alphas, values, marker="o", markersize=3, label=label)
        for end in (0.0, 1.0):  # where the two models are, on a grid that extends past them
            ax.axvline(end, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("alpha  (1: model a, 0: model b)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, plt, path, title)


def plot_plane(scan: PlaneScan, path: str | Path, title: str = "") -> Path:
    """Contours of loss and of error (1 - accuracy) on the plane, the three models marked and
    labelled, their mean as a white cross (IMA Fig. 1); returns ``path`` (a PNG)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, name, values in ((axes[0], "loss", scan.loss), (axes[1], "error", 1.0 - scan.accuracy)):
        filled = ax.contourf(scan.xs, scan.ys, values, levels=20, cmap="viridis")
        ax.contour(scan.xs, scan.ys, values, levels=20, colors="k", linewidths=0.3, alpha=0.5)
        fig.colorbar(filled, ax=ax, label=name)
        ax.scatter(scan.coords[:, 0], scan.coords[:, 1], c="red", edgecolors="white", zorder=3)
        for (x, y), label in zip(scan.coords, scan.labels):
            ax.annotate(
                label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=9,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.7, "linewidth": 0},
            )  # fmt: skip
        centre = scan.coords.mean(axis=0)
        ax.scatter([centre[0]], [centre[1]], marker="x", c="white", zorder=3)
        ax.set_title(name)
        ax.set_aspect("equal", adjustable="box")
    return _save(fig, plt, path, title)


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, plt: ModuleType, path: str | Path, title: str) -> Path:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- IMA's loss decomposition: estimators on model outputs (notes/ima.md section 3.3) ---------


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities of (n, C) logits, computed stably in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def squared_error(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per example ``||softmax(f(x)) - onehot(y)||^2``: IMA's MSE loss (Theorem 1), in [0, 2]."""
    p = softmax(logits)
    rows = np.arange(len(p))
    return np.asarray((p**2).sum(axis=-1) - 2 * p[rows, labels] + 1.0)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per example ``-log softmax(f(x))_y`` (natural log), computed stably."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(z - top).sum(axis=-1)) + top[:, 0]
    return np.asarray(log_norm - z[np.arange(len(z)), labels])


def output_spread(logits: Sequence[np.ndarray]) -> float:
    """``mean_x mean_k ||p_k(x) - p_bar(x)||^2`` with ``p_k = softmax`` of model k's outputs and
    ``p_bar`` their mean: the variance term of IMA's eq. (2) in its finite form over the models
    (``mean_k ||p_k - y||^2 = ||p_bar - y||^2 + spread``, example by example)."""
    p = np.stack([softmax(z) for z in logits])  # (K, n, C)
    return float(((p - p.mean(axis=0)) ** 2).sum(axis=-1).mean())


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two representations of the same n inputs (Kornblith et al., ICML 2019,
    arXiv:1905.00414, eq. 5): with column-centred X (n, p) and Y (n, q),
    ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)``; 1 for identical (or rotated, or scaled) ones.
    """
    a = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    b = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    if len(a) != len(b):
        raise ValueError(f"linear_cka: the representations cover {len(a)} and {len(b)} inputs")
    a, b = a - a.mean(axis=0), b - b.mean(axis=0)
    denominator = np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b)
    return float(np.linalg.norm(b.T @ a) ** 2 / denominator) if denominator > 0 else 0.0


def mean_pairwise_cka(logits: Sequence[np.ndarray]) -> float:
    """The mean linear CKA over the pairs of models: IMA's covariance measure (Fig. 4)."""
    pairs = [(i, j) for i in range(len(logits)) for j in range(i + 1, len(logits))]
    if not pairs:
        raise ValueError("mean_pairwise_cka: needs at least two models")
    return float(np.mean([linear_cka(logits[i], logits[j]) for i, j in pairs]))
