"""Per-client evaluation rows pooled into one, the row of all their examples together, and
summarized as ``eval/...`` metrics (``summarize_clients``, ``scored``) for every predictor evaluated:
the engine's global model, ``Services.evaluate_weights``' predictors and the Local baseline's models.

An evaluation row (``raysim.measure.evaluate.evaluate``) holds means over its examples (``loss``, and
``accuracy`` where the task has one), ``num_examples`` (tokens for a causal LM) and the additive
statistics of the scores that are no means (``sums/...``: MCC, F1, Pearson, ``raysim.measure.scores``).
Pooling weights each mean by its row's examples, sums the statistics and finishes the scores from
them, and takes the perplexity of the pooled loss: the pooled row is the row the concatenated
examples would give. Every place that pools rows uses ``pool_rows``: the engine's evaluation of
clients, the scans of ``raysim.measure.landscape``, the ``local_accuracy`` probe and the Local baseline.
``weighted_means`` (``raysim.aggregate``) is its arithmetic for any weight.

Usage:
    pooled = pool_rows(rows)             # None when no row has examples
    report = scores.without_sums(pooled)  # loss, accuracy, mcc, ..., num_examples
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from raysim.aggregate import weighted_means
from raysim.measure import scores
from raysim.types import Metrics

# The row entries that are no means over examples: the identity and size of a row, and the
# perplexity, which is exp(loss), not the mean of the rows' perplexities.
_NOT_MEANS = frozenset({"client_id", "num_examples", "perplexity"})
MAX_LOG_PERPLEXITY = 50.0  # exp(50): a diverged model's perplexity stays a float


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a per-token cross-entropy in nats, capped at ``exp(50)``."""
    return math.exp(min(loss, MAX_LOG_PERPLEXITY))


def pool_rows(rows: Iterable[Metrics | None]) -> Metrics | None:
    """The rows as one row of their examples together; None when no row has examples.

    Each mean is weighted by ``num_examples`` over the rows that carry it, the ``sums/``
    statistics are summed (and kept, so pooled rows pool again) and the scores recomputed from
    them, ``perplexity`` is that of the pooled loss and ``num_examples`` the total. ``None`` rows
    (the engine's "no data here") and rows without examples are left out.
    """
    kept = [row for row in rows if row is not None and row.get("num_examples", 0) > 0]
    if not kept:
        return None
    finished = scores.pool(kept)
    sums = {k for row in kept for k in row if k.startswith(scores.SUMS)}
    out = weighted_means(
        kept, [row["num_examples"] for row in kept], _NOT_MEANS | sums | set(finished) | {"num_examples"}
    )
    if any("perplexity" in row for row in kept) and "loss" in out:
        out["perplexity"] = perplexity(out["loss"])
    for row in kept:
        for key, value in row.items():
            if key.startswith(scores.SUMS):
                out[key] = out.get(key, 0.0) + value
    return out | finished | {"num_examples": float(sum(row["num_examples"] for row in kept))}


def scored(prefix: str, row: Metrics | None) -> Metrics:
    """An evaluation row's scores under ``prefix`` (``eval/central``): its means and finished
    scores, not its sums or size; none without a row (no such data)."""
    if row is None:
        return {}
    return {f"{prefix}/{k}": float(v) for k, v in scores.without_sums(row).items() if k != "num_examples"}


_SPREAD = ("accuracy", "loss")  # metrics whose distribution over clients is reported
_NOT_METRICS = frozenset({"client_id", "num_examples"})


def summarize_clients(per_client: list[Metrics], scope: str = "eval/clients") -> Metrics:
    """Per metric: the clients' examples pooled (``pool_rows``: example-weighted means, scores
    from the summed statistics) and the unweighted mean over clients (``_mean``);
    for accuracy and loss also the spread over clients (std, 10th / 50th / 90th percentile)."""
    pooled = pool_rows(per_client)
    if pooled is None:
        return {}
    out: Metrics = {f"{scope}/num_clients": float(len(per_client))}
    for key in sorted(set(scores.without_sums(pooled)) - _NOT_METRICS):
        values = np.array([m[key] for m in per_client if key in m])
        out |= {f"{scope}/{key}": pooled[key], f"{scope}/{key}_mean": float(values.mean())}
        if key in _SPREAD:
            out |= {
                f"{scope}/{key}_std": float(values.std()),
                f"{scope}/{key}_p10": float(np.percentile(values, 10)),
                f"{scope}/{key}_p50": float(np.percentile(values, 50)),
                f"{scope}/{key}_p90": float(np.percentile(values, 90)),
            }
    return out
