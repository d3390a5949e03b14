"""Evaluation scores that are not means over examples: MCC, F1 and Pearson's r.

GLUE (Wang et al., ICLR 2019, arXiv:1804.07461) scores CoLA by the Matthews correlation
coefficient, MRPC and QQP by F1 beside accuracy, and STS-B by Pearson (and Spearman) correlation;
FedGuCci (Li et al., KDD 2025, arXiv:2402.18949, Table 3) reports CoLA's MCC and STS-B's
correlation x 100. A dataset
asks for them in its spec (``DataSpec.metrics``).

None of them is a mean of per-batch or per-client values, so nothing averages them. Each is a
function of additive sufficient statistics: ``evaluate`` (``raysim.train.local``) sums them over
batches and returns them beside the score under ``SUMS`` keys, and the engine sums them over
clients and finishes the score (``pool``): pooled clients score exactly as their concatenated
examples would. The statistics:

- ``sums/confusion/<true>_<predicted>``: the confusion counts C[t, p] of a classifier (the
  prediction is the argmax). With c = trace C, s = sum C, t_k = row sums, p_k = column sums,
      MCC = (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2))
  (Gorodkin's K-class form, which sklearn computes; for K = 2 the usual (TP TN - FP FN) / ...),
      F1  = 2 TP / (2 TP + FP + FN), class 1 positive (binary tasks only).
- ``sums/moments/<n|x|y|xx|yy|xy>``: count and sums of a regressor's predictions x, targets y,
  their squares and products (every output flattened), in float64:
      Pearson r = (n Sxy - Sx Sy) / sqrt((n Sxx - Sx^2) (n Syy - Sy^2)).

A score whose denominator is zero (a single class, a constant prediction, fewer than two
examples) is 0, as sklearn's ``matthews_corrcoef`` and ``f1_score`` return. Spearman's rank
correlation has no additive statistics and is not offered.

Usage:
    sums = batch_statistics(spec, outputs, y)                  # per batch, tensors to add up
    row = finish(spec.metrics, statistics_metrics(sums))       # {"mcc": ...}
    pool([row_client_1, row_client_2])                         # the clients' examples together
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from raysim.types import DataSpec, Metrics, Task

SUMS = "sums/"  # prefix of the sufficient statistics among an evaluation's metrics
MOMENTS = ("n", "x", "y", "xx", "yy", "xy")
Statistic = Literal["confusion", "moments"]


def mcc(confusion: np.ndarray) -> float:
    """Matthews correlation of a (K, K) confusion matrix (rows: true class, columns: predicted)."""
    c = confusion.astype(np.float64)
    s, correct = c.sum(), np.trace(c)
    true, predicted = c.sum(1), c.sum(0)
    denominator = math.sqrt((s * s - predicted @ predicted) * (s * s - true @ true))
    return float((correct * s - predicted @ true) / denominator) if denominator > 0 else 0.0


def f1(confusion: np.ndarray) -> float:
    """F1 of class 1 from a (2, 2) confusion matrix."""
    tp, fp, fn = confusion[1, 1], confusion[0, 1], confusion[1, 0]
    denominator = float(2 * tp + fp + fn)
    return float(2 * tp) / denominator if denominator > 0 else 0.0


def pearson(moments: np.ndarray) -> float:
    """Pearson's r from (n, Sx, Sy, Sxx, Syy, Sxy); 0 when either side is constant.

    ``n Sxx - Sx^2`` cancels catastrophically for (nearly) constant values: summed in float64 it
    leaves rounding noise of about ``1e-16 n Sxx``, which would give r ~ 1e-8 instead of 0. A
    spread below ``1e-12 n Sxx`` (a relative standard deviation under 1e-6) counts as constant.
    """
    n, sx, sy, sxx, syy, sxy = moments.astype(np.float64)
    spread_x, spread_y = n * sxx - sx * sx, n * syy - sy * sy
    if spread_x <= 1e-12 * n * sxx or spread_y <= 1e-12 * n * syy:
        return 0.0
    return float((n * sxy - sx * sy) / math.sqrt(spread_x * spread_y))


@dataclass(frozen=True)
class Score:
    """A score: the task it applies to, the statistic it is computed from, and how."""

    task: Task
    statistic: Statistic
    compute: Callable[[np.ndarray], float]


SCORES: dict[str, Score] = {
    "mcc": Score("classification", "confusion", mcc),
    "f1": Score("classification", "confusion", f1),
    "pearson": Score("regression", "moments", pearson),
}


def check_metrics(spec: DataSpec) -> None:
    """Raises ValueError when ``spec.metrics`` names an unknown score or one its task lacks."""
    for name in spec.metrics:
        score = SCORES.get(name)
        if score is None:
            raise ValueError(f"unknown metric {name!r} in the data spec; known: {', '.join(SCORES)}")
        if score.task != spec.task:
            raise ValueError(f"metric {name!r} scores {score.task}, not {spec.task}")
        if name == "f1" and spec.num_classes != 2:
            raise ValueError(f"metric 'f1' scores binary tasks, not {spec.num_classes} classes")


def batch_statistics(spec: DataSpec, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The statistics ``spec.metrics`` need, for one batch of model outputs and targets.

    They stay on the device; add them up over batches and read them once (``statistics_metrics``).
    """
    needed = {SCORES[name].statistic for name in spec.metrics}
    out = {}
    if "confusion" in needed:
        k = spec.num_classes
        out["confusion"] = torch.bincount(y * k + outputs.argmax(-1), minlength=k * k)
    if "moments" in needed:
        x, t = outputs.detach().double().reshape(-1), y.double().reshape(-1)
        n = x.new_tensor(float(x.numel()))
        out["moments"] = torch.stack([n, x.sum(), t.sum(), (x * x).sum(), (t * t).sum(), (x * t).sum()])
    return out


def statistics_metrics(statistics: Mapping[str, torch.Tensor]) -> Metrics:
    """Summed statistics as ``sums/...`` metrics (one device read)."""
    out: Metrics = {}
    if "confusion" in statistics:
        counts = statistics["confusion"].cpu().numpy()
        k = math.isqrt(len(counts))
        out |= {f"{SUMS}confusion/{t}_{p}": float(counts[t * k + p]) for t in range(k) for p in range(k)}
    if "moments" in statistics:
        values = statistics["moments"].cpu().numpy()
        out |= {f"{SUMS}moments/{name}": float(v) for name, v in zip(MOMENTS, values)}
    return out


def finish(names: Iterable[str], sums: Mapping[str, float]) -> Metrics:
    """Each named score from the ``sums/...`` statistics (absent ones count as zero)."""
    return {name: SCORES[name].compute(_statistic(SCORES[name].statistic, sums)) for name in names}


def pool(rows: Sequence[Metrics]) -> Metrics:
    """The scores the rows carry, each from the rows' statistics summed: the score of all the
    rows' examples together (per-client evaluations -> the clients' pooled score)."""
    names = [name for name in SCORES if any(name in row for row in rows)]
    totals: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(SUMS):
                totals[key] = totals.get(key, 0.0) + value
    return finish(names, totals)


def without_sums(metrics: Metrics) -> Metrics:
    """The metrics to report: the statistics left out."""
    return {k: v for k, v in metrics.items() if not k.startswith(SUMS)}


def _statistic(kind: Statistic, sums: Mapping[str, float]) -> np.ndarray:
    """The confusion matrix (K, K) or the moments vector (6,) held in ``sums``."""
    if kind == "moments":
        return np.array([sums.get(f"{SUMS}moments/{name}", 0.0) for name in MOMENTS])
    prefix = f"{SUMS}confusion/"
    cells = {tuple(map(int, k[len(prefix) :].split("_"))): v for k, v in sums.items() if k.startswith(prefix)}
    k = 1 + max((max(cell) for cell in cells), default=1)
    matrix = np.zeros((k, k))
    for (t, p), count in cells.items():
        matrix[t, p] = count
    return matrix
