"""Byzantine-robust aggregation rules over a round's stacked updates (docs/robustness.md).

Each rule takes ``x`` (n, d): one flattened float32 update a row, on any device (the weights and
start follow it), and the rows' weights where it averages; it returns the aggregate (d,) float32
on ``x``'s device and its metrics. Coordinate-wise rules sort, and pairwise distances accumulate,
over column chunks of ``chunk`` coordinates, so the temporaries stay ``n x chunk`` (``n x n`` for
distances) whatever ``d`` is (``raysim.robust.placement`` sizes ``chunk`` from a memory budget).

Sorting is exact in float32 (a float64 copy would order the same values the same way); sums and
distances run in float64 chunk by chunk, never over a float64 copy of all of ``x``: a float32 sum
of a million squares loses the digits that decide Krum's choice and Weiszfeld's stopping test.

Usage:
    aggregate, metrics = krum_mean(x, f=2, m=1, chunk=column_chunk(len(x)))
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from raysim.config.robust import trimmed_count
from raysim.types import Metrics

TEMPORARY_VALUES = 2**22  # a chunk's values on the CPU by default: 96 MiB of temporaries (placement)


def column_chunk(n: int, budget: int = TEMPORARY_VALUES) -> int:
    """Coordinates per chunk so that ``n`` rows of them hold ``budget`` values at most."""
    return max(1, budget // max(n, 1))


def column_slices(d: int, chunk: int) -> Iterator[slice]:
    """The column chunks of ``d`` coordinates, ``chunk`` at a time."""
    return (slice(start, min(start + chunk, d)) for start in range(0, d, chunk))


def median(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, Metrics]:
    """Coordinate-wise median: the middle value, the mean of the two middle ones for even ``n``."""
    n, d = x.shape
    out = torch.empty(d, dtype=torch.float32, device=x.device)
    for cols in column_slices(d, chunk):
        ordered = x[:, cols].sort(dim=0).values
        middle = ordered[(n - 1) // 2].to(torch.float64) + ordered[n // 2].to(torch.float64)
        out[cols] = (middle / 2).to(torch.float32)
    return out, {}


def trimmed_mean(x: torch.Tensor, beta: float, chunk: int) -> tuple[torch.Tensor, Metrics]:
    """Coordinate-wise mean of what is left once ``floor(beta * n)`` values are dropped from each end."""
    n, d = x.shape
    k = trimmed_count(beta, n)
    if n - 2 * k < 1:
        raise ValueError(f"trimming {k} of {n} updates from each side leaves none; lower robust.beta")
    out = torch.empty(d, dtype=torch.float32, device=x.device)
    for cols in column_slices(d, chunk):
        ordered = x[:, cols].sort(dim=0).values
        out[cols] = ordered[k : n - k].to(torch.float64).mean(0).to(torch.float32)
    return out, {"robust/trimmed": float(2 * k)}


def squared_distances(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """(n, n) float64 squared Euclidean distances between rows, summed over column chunks."""
    n, d = x.shape
    total = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    for cols in column_slices(d, chunk):
        part = x[:, cols].to(torch.float64)
        total += torch.cdist(part, part, compute_mode="donot_use_mm_for_euclid_dist").square()
    return total


def krum_scores(distances: torch.Tensor, f: int) -> torch.Tensor:
    """Each row's sum of squared distances to its ``n - f - 2`` nearest other rows."""
    n = len(distances)
    closest = n - f - 2
    if n <= 2 * f + 2:  # Blanchard et al.'s condition for Krum's guarantee
        raise ValueError(f"Krum needs n > 2f + 2 updates, got n={n} for f={f}; lower robust.f")
    others = distances + torch.diag(
        torch.full((n,), float("inf"), dtype=distances.dtype, device=distances.device)
    )
    return others.sort(dim=1).values[:, :closest].sum(1)


def krum_selection(x: torch.Tensor, f: int, m: int, chunk: int) -> torch.Tensor:
    """The indices of the ``m`` rows of lowest Krum score, best first, ties to the lower row."""
    scores = krum_scores(squared_distances(x, chunk), f)
    return torch.sort(scores, stable=True).indices[: min(m, len(x))]


def krum_mean(
    x: torch.Tensor, f: int, m: int, chunk: int, scales: torch.Tensor | None = None
) -> tuple[torch.Tensor, Metrics]:
    """The mean of the ``m`` rows of lowest Krum score (Krum: ``m = 1``), ties to the lower row;
    with ``scales`` (n,), each chosen row times its scale, the choice made on the rows as given."""
    chosen = krum_selection(x, f, m, chunk)
    factors = None if scales is None else scales.to(x.device, torch.float64)[chosen, None]
    out = torch.zeros(x.shape[1], dtype=torch.float32, device=x.device)
    for cols in column_slices(x.shape[1], chunk):
        rows = x[:, cols][chosen].to(torch.float64)
        out[cols] = (rows if factors is None else rows * factors).mean(0).to(torch.float32)
    return out, {"robust/selected": float(len(chosen))}


def row_distances(x: torch.Tensor, v: torch.Tensor, chunk: int) -> torch.Tensor:
    """(n,) float64 L2 distance of each row of ``x`` from ``v`` (d,)."""
    total = torch.zeros(len(x), dtype=torch.float64, device=x.device)
    for cols in column_slices(x.shape[1], chunk):
        total += (x[:, cols].to(torch.float64) - v[cols].to(torch.float64)).square().sum(1)
    return total.sqrt()


def weighted_rows(x: torch.Tensor, coefficients: torch.Tensor, chunk: int) -> torch.Tensor:
    """``sum_i coefficients[i] * x[i]`` (d,) float64."""
    out = torch.empty(x.shape[1], dtype=torch.float64, device=x.device)
    c = coefficients.to(x.device, torch.float64)
    for cols in column_slices(x.shape[1], chunk):
        out[cols] = c @ x[:, cols].to(torch.float64)
    return out


def geometric_median(
    x: torch.Tensor, weights: torch.Tensor, nu: float, max_iterations: int, tol: float, chunk: int
) -> tuple[torch.Tensor, Metrics]:
    """RFA's smoothed Weiszfeld (Pillutla et al. 2022, Alg. 3): from the weighted mean,
    ``v <- sum_i b_i x_i / sum_i b_i`` with ``b_i = a_i / max(nu, |v - x_i|)``, until the weighted
    sum of distances ``g`` changes by at most ``tol * g``."""
    w = weights.to(x.device, torch.float64)
    alphas = w / w.sum()
    v = weighted_rows(x, alphas, chunk)
    distances = row_distances(x, v, chunk)  # a pass over every update: once an iteration
    objective = float((alphas * distances).sum())
    iterations = 0
    while iterations < max_iterations:
        betas = alphas / distances.clamp(min=nu)
        v = weighted_rows(x, betas / betas.sum(), chunk)
        iterations += 1
        distances = row_distances(x, v, chunk)
        previous, objective = objective, float((alphas * distances).sum())
        if abs(previous - objective) <= tol * objective:
            break
    return v.to(torch.float32), {"robust/weiszfeld_iterations": float(iterations)}


def norm_bounded_mean(
    x: torch.Tensor, weights: torch.Tensor, max_norm: float, chunk: int
) -> tuple[torch.Tensor, Metrics]:
    """The weighted mean of the rows, each first scaled to L2 norm at most ``max_norm``."""
    norms = row_distances(x, torch.zeros(x.shape[1], device=x.device), chunk)
    scales = (max_norm / norms.clamp(min=1e-12)).clamp(max=1.0)
    w = weights.to(x.device, torch.float64)
    mean = weighted_rows(x, w * scales / w.sum(), chunk)
    return mean.to(torch.float32), {"robust/clipped_fraction": float((norms > max_norm).double().mean())}


def centered_clip(
    x: torch.Tensor, start: torch.Tensor, tau: float, iterations: int, chunk: int
) -> tuple[torch.Tensor, Metrics]:
    """``v <- v + mean_i (x_i - v) * min(1, tau / |x_i - v|)``, ``iterations`` times from ``start``
    (Karimireddy et al. 2021, eq. 3); each client counts once."""
    v = start.to(x.device, torch.float64)
    clipped = 0.0
    for _ in range(iterations):
        distances = row_distances(x, v, chunk)
        scales = (tau / distances.clamp(min=1e-12)).clamp(max=1.0)
        clipped = float((distances > tau).double().mean())
        coefficients = scales / len(x)  # v + mean_i s_i (x_i - v) = (1 - mean s) v + sum s_i x_i / n
        v = (1 - coefficients.sum()) * v + weighted_rows(x, coefficients, chunk)
    return v.to(torch.float32), {"robust/clipped_fraction": clipped}
