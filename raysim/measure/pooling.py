"""Per-client evaluation rows pooled into one: the row of all their examples together.

An evaluation row (``raysim.measure.evaluate.evaluate``) holds means over its examples (``loss``, and
``accuracy`` where the task has one), ``num_examples`` (tokens for a causal LM) and the additive
statistics of the scores that are no means (``sums/...``: MCC, F1, Pearson, ``raysim.measure.scores``).
Pooling weights each mean by its row's examples, sums the statistics and finishes the scores from
them, and takes the perplexity of the pooled loss: the pooled row is the row the concatenated
examples would give. Every place that pools rows uses ``pool_rows``: the engine's evaluation of
clients, the scans of ``raysim.measure.landscape``, the ``local_accuracy`` probe and the Local baseline.
``weighted_means`` (``raysim.aggregate``) is its arithmetic for any weight: the round loop and the
one-shot methods average the clients' train metrics with it, by client weight.

Usage:
    pooled = pool_rows(rows)             # None when no row has examples
    report = scores.without_sums(pooled)  # loss, accuracy, mcc, ..., num_examples
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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
    out = weighted_means(kept, "num_examples", _NOT_MEANS | sums | set(finished))
    if any("perplexity" in row for row in kept) and "loss" in out:
        out["perplexity"] = perplexity(out["loss"])
    for row in kept:
        for key, value in row.items():
            if key.startswith(scores.SUMS):
                out[key] = out.get(key, 0.0) + value
    return out | finished | {"num_examples": float(sum(row["num_examples"] for row in kept))}


