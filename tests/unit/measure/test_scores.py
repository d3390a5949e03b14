"""GLUE's scores (raysim/measure/scores.py) against sklearn and scipy, computed independently on the same
predictions: per batch, per client, and pooled over clients by the engine's summary.

The model under test is a lookup table: example i's input is its index, and its output is row i
of a fixed random table, so the reference knows every prediction without running the code under
test. Pooling must give the score of the concatenated examples, which a mean of per-client (or
per-batch) scores does not (the last test shows the two differ on this data).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr
from sklearn.metrics import f1_score, matthews_corrcoef
from torch import nn

from raysim.measure import scores
from raysim.measure.evaluate import evaluate
from raysim.measure.pooling import summarize_clients
from raysim.types import ClientData, DataSpec


class Lookup(nn.Module):
    """Returns ``table[x]``: the outputs are fixed in advance, per example index."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("table", torch.as_tensor(table))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0]]


def client_rows(spec, table, targets, clients, batch_size):
    """``evaluate`` on each client's slice of the examples, as the engine receives them."""
    model = Lookup(table)
    rows = []
    for ids in clients:
        data = ClientData({"x": ids[:, None].astype(np.int64), "y": targets[ids]})
        rows.append(evaluate(model, data, spec, batch_size=batch_size))
    return rows


SPLITS = [np.arange(0, 37), np.arange(37, 60), np.arange(60, 100)]  # three clients


@pytest.mark.parametrize("num_classes", [2, 3])
def test_mcc_per_client_and_pooled_match_sklearn(num_classes):
    rng = np.random.default_rng(num_classes)
    logits = rng.normal(size=(100, num_classes)).astype(np.float32)
    labels = rng.integers(0, num_classes, 100)
    logits[labels == 1, 1] += 1.0  # some signal, so MCC is not near 0
    predicted = logits.argmax(1)
    spec = DataSpec("classification", (1,), num_classes, metrics=("mcc",))
    rows = client_rows(spec, logits, labels, SPLITS, batch_size=8)  # several batches per client
    for row, ids in zip(rows, SPLITS):
        assert row["mcc"] == pytest.approx(matthews_corrcoef(labels[ids], predicted[ids]), abs=1e-12)
    summary = summarize_clients(rows)
    assert summary["eval/clients/mcc"] == pytest.approx(matthews_corrcoef(labels, predicted), abs=1e-12)
    per_client = [matthews_corrcoef(labels[ids], predicted[ids]) for ids in SPLITS]
    assert summary["eval/clients/mcc_mean"] == pytest.approx(np.mean(per_client), abs=1e-12)
    assert not any(key.startswith("eval/clients/sums/") for key in summary)


def test_f1_pooled_matches_sklearn():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(100, 2)).astype(np.float32)
    labels = rng.integers(0, 2, 100)
    spec = DataSpec("classification", (1,), 2, metrics=("f1", "mcc"))
    rows = client_rows(spec, logits, labels, SPLITS, batch_size=16)
    predicted = logits.argmax(1)
    assert rows[0]["f1"] == pytest.approx(f1_score(labels[SPLITS[0]], predicted[SPLITS[0]]), abs=1e-12)
    summary = summarize_clients(rows)
    assert summary["eval/clients/f1"] == pytest.approx(f1_score(labels, predicted), abs=1e-12)
    assert summary["eval/clients/mcc"] == pytest.approx(matthews_corrcoef(labels, predicted), abs=1e-12)


def test_pearson_per_client_and_pooled_match_scipy():
    rng = np.random.default_rng(1)
    targets = rng.uniform(0, 5, 100).astype(np.float32)  # STS-B's score range
    predictions = (0.6 * targets + rng.normal(0, 1, 100)).astype(np.float32)[:, None]  # (n, 1)
    spec = DataSpec("regression", (1,), 1, metrics=("pearson",))
    rows = client_rows(spec, predictions, targets, SPLITS, batch_size=7)
    x = predictions[:, 0].astype(np.float64)
    for row, ids in zip(rows, SPLITS):
        assert row["pearson"] == pytest.approx(pearsonr(x[ids], targets[ids]).statistic, abs=1e-9)
        assert row["loss"] == pytest.approx(np.mean((x[ids] - targets[ids]) ** 2), rel=1e-5)
    pooled = pearsonr(x, targets).statistic
    summary = summarize_clients(rows)
    assert summary["eval/clients/pearson"] == pytest.approx(pooled, abs=1e-9)
    # pooling is not averaging: on this data the mean of the clients' r is another number
    assert abs(summary["eval/clients/pearson_mean"] - pooled) > 1e-3


def test_pool_sums_statistics_and_keeps_unscored_rows_out():
    """Two clients' confusion counts by hand: [[3, 1], [0, 0]] and [[0, 0], [1, 3]] pool to
    [[3, 1], [1, 3]]: MCC = (6 * 8 - (4 * 4 + 4 * 4)) / sqrt((64 - 32) * (64 - 32)) = 0.5,
    while each client alone has a single true class (MCC 0)."""
    a = {"mcc": 0.0, "sums/confusion/0_0": 3.0, "sums/confusion/0_1": 1.0}
    b = {"mcc": 0.0, "sums/confusion/1_0": 1.0, "sums/confusion/1_1": 3.0}
    assert scores.pool([a, b]) == {"mcc": pytest.approx(0.5)}
    assert scores.pool([{"accuracy": 1.0}]) == {}
    assert scores.without_sums(a) == {"mcc": 0.0}


def test_degenerate_scores_are_zero_as_sklearn_says():
    one_class = np.array([[4.0, 0.0], [0.0, 0.0]])
    assert scores.mcc(one_class) == 0.0 == matthews_corrcoef([0] * 4, [0] * 4)
    assert scores.f1(one_class) == 0.0
    assert scores.pearson(np.array([3.0, 6.0, 1.0, 12.0, 1.0, 2.0])) == 0.0  # constant x


def test_constant_predictions_score_zero_not_rounding_noise():
    """A model that predicts 2.7 for everything: n Sxx - Sx^2 is 0 exactly, but the float64 sums
    of 333 float32 predictions over 11 batches leave a little of it (r was 2.2e-8)."""
    rng = np.random.default_rng(2)
    targets = rng.uniform(0, 5, 1000).astype(np.float32)
    spec = DataSpec("regression", (1,), 1, metrics=("pearson",))
    constant = np.full((1000, 1), 2.7, np.float32)
    rows = client_rows(spec, constant, targets, [np.arange(333), np.arange(333, 1000)], batch_size=32)
    assert [row["pearson"] for row in rows] == [0.0, 0.0]
    assert summarize_clients(rows)["eval/clients/pearson"] == 0.0
    # a spread far above the rounding noise (relative std 1e-4) is still scored as scipy does
    x, y = 2.7 + 3e-4 * rng.normal(size=1000), targets.astype(np.float64)
    moments = np.array([1000, x.sum(), y.sum(), x @ x, y @ y, x @ y])
    assert scores.pearson(moments) == pytest.approx(pearsonr(x, y).statistic, abs=1e-6)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (DataSpec("classification", (1,), 2, metrics=("spearman",)), "unknown metric 'spearman'"),
        (DataSpec("regression", (1,), 1, metrics=("mcc",)), "scores classification"),
        (DataSpec("classification", (1,), 3, metrics=("f1",)), "binary"),
    ],
)
def test_metrics_a_spec_cannot_have_are_refused(spec, message):
    data = ClientData({"x": np.zeros((2, 1), np.int64), "y": np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match=message):
        evaluate(Lookup(np.zeros((2, 2), np.float32)), data, spec)
