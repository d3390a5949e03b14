"""Parameter points evaluated through the engine: the ``map_clients`` call behind every scan.

``clients=None`` evaluates on the dataset's central test set, a list of clients on their data
(rows pooled weighted by ``num_examples``); ``raysim.measure.landscape`` builds its scans on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from raysim.measure import scores
from raysim.measure.pooling import pool_rows
from raysim.services import EVALUATE, MapRequest, Services
from raysim.types import NumpyParams

# What one ``map_clients`` call of a scan may hold in parameter points, unless told otherwise
SCAN_BYTES_PER_CALL = 1 << 30

# Metric name -> its value at each evaluated point: ``loss``, ``accuracy`` (a task with one: not
# regression), the dataset's scores (``mcc``, ``f1``, ``pearson``), a causal LM's ``perplexity``.
Values = dict[str, np.ndarray]


def evaluate_points(
    services: Services[object],
    points: Sequence[NumpyParams],
    clients: Sequence[int] | np.ndarray | None = None,
    split: str = "test",
    *,
    round_num: int | None = None,
) -> Values:
    """The metrics of every point, in one ``map_clients`` call spread over the workers.

    ``clients`` None: the central test set; else the clients' ``split`` data, each point's
    per-client rows pooled (``raysim.measure.pooling.pool_rows``): means weighted by ``num_examples``,
    MCC, F1 and Pearson from the summed statistics.

    Raises:
        NoExamplesError: the dataset has no central test set, or the clients have no data in
            ``split``.
    """
    if not points:
        raise ValueError("evaluate_points: no points to evaluate")
    results = services.map_clients(MapRequest(EVALUATE, points, clients, split=split, round_num=round_num))
    pooled = [pool_rows(rows) for rows in results]
    rows = [row for row in pooled if row is not None]
    if len(rows) < len(pooled):
        raise NoExamplesError(clients, split)
    names = [name for name in scores.without_sums(rows[0]) if name != "num_examples"]
    return {name: np.array([row[name] for row in rows]) for name in names}


def evaluate_in_calls(
    services: Services[object],
    make_point: Callable[[int], NumpyParams],
    count: int,
    clients: Sequence[int] | np.ndarray | None,
    split: str,
    *,
    round_num: int | None,
    points_per_call: int | None,
) -> Values:
    """``evaluate_points`` of ``make_point(0..count-1)``, built and sent ``points_per_call`` at a
    time (default: as many as fit in ``SCAN_BYTES_PER_CALL``), so a large grid of a large model
    never sits in memory all at once."""
    if count == 0:
        raise ValueError("a scan needs at least one point to evaluate")
    first = make_point(0)
    step = points_per_call or max(1, SCAN_BYTES_PER_CALL // max(1, _num_bytes(first)))
    parts = []
    for start in range(0, count, step):
        points = [first if i == 0 else make_point(i) for i in range(start, min(start + step, count))]
        parts.append(evaluate_points(services, points, clients, split, round_num=round_num))
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


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
