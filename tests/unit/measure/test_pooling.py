"""raysim/measure/pooling.py: pooled rows are the rows of the concatenated examples.

Each client's row comes from ``raysim.measure.evaluate.evaluate`` of a lookup model (example i's output is row
i of a fixed table, as in test_scores.py), so the reference knows every prediction: torch's
cross-entropy and MSE, sklearn's MCC and F1 and scipy's Pearson on all the examples at once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import pearsonr
from sklearn.metrics import f1_score, matthews_corrcoef
from torch import nn

from raysim.measure import scores
from raysim.measure.evaluate import evaluate
from raysim.measure.pooling import pool_rows, scored, summarize_clients, weighted_means
from raysim.types import ClientData, DataSpec

SPLITS = [np.arange(0, 13), np.arange(13, 20), np.arange(20, 41)]  # three clients


class Lookup(nn.Module):
    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("table", torch.as_tensor(table))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0]]


def rows_of(spec: DataSpec, table: np.ndarray, targets: np.ndarray) -> list:
    model = Lookup(table)
    return [
        evaluate(
            model, ClientData({"x": ids[:, None].astype(np.int64), "y": targets[ids]}), spec, batch_size=4
        )
        for ids in SPLITS
    ]


def test_a_classifiers_pooled_row_is_that_of_all_its_clients_examples():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(41, 2)).astype(np.float32)
    labels = rng.integers(0, 2, 41)
    rows = rows_of(DataSpec("classification", (1,), 2, metrics=("mcc", "f1")), logits, labels)
    empty = {"loss": 0.0, "accuracy": 0.0, "num_examples": 0.0}
    pooled = pool_rows([rows[0], None, rows[1], empty, rows[2]])  # no data: left out
    predicted = logits.argmax(1)
    want_loss = F.cross_entropy(torch.as_tensor(logits, dtype=torch.float64), torch.as_tensor(labels)).item()
    assert pooled["loss"] == pytest.approx(want_loss, rel=1e-6)
    assert pooled["accuracy"] == pytest.approx(np.mean(predicted == labels))
    assert pooled["mcc"] == pytest.approx(matthews_corrcoef(labels, predicted), abs=1e-12)
    assert pooled["f1"] == pytest.approx(f1_score(labels, predicted), abs=1e-12)
    assert pooled["num_examples"] == 41 and "client_id" not in pooled
    # the statistics stay, so pooled rows pool again to the same row
    assert pool_rows([pool_rows(rows[:2]), rows[2]]) == pytest.approx(pool_rows(rows))
    assert pool_rows([None, empty]) is None and pool_rows([]) is None


def test_a_regressors_rows_have_no_accuracy_and_pool_pearson_over_all_examples():
    rng = np.random.default_rng(1)
    targets = rng.uniform(0, 5, 41).astype(np.float32)
    predictions = (0.5 * targets + rng.normal(0, 1, 41)).astype(np.float32)[:, None]
    rows = rows_of(DataSpec("regression", (1,), 1, metrics=("pearson",)), predictions, targets)
    assert all("accuracy" not in row for row in rows)  # a regressor's accuracy would be a fake 0
    pooled = scores.without_sums(pool_rows(rows))
    x = predictions[:, 0].astype(np.float64)
    assert pooled == {
        "loss": pytest.approx(np.mean((x - targets) ** 2), rel=1e-5),
        "pearson": pytest.approx(pearsonr(x, targets).statistic, abs=1e-9),
        "num_examples": 41.0,
    }


def test_the_pooled_perplexity_is_that_of_the_pooled_loss():
    """Token-weighted loss (3 * 1 + 1 * 3) / 4 = 1.5: perplexity e^1.5, not the mean of e and e^3."""
    rows = [
        {"loss": 1.0, "accuracy": 0.5, "perplexity": math.e, "num_examples": 3.0},
        {"loss": 3.0, "accuracy": 0.1, "perplexity": math.e**3, "num_examples": 1.0},
    ]
    pooled = pool_rows(rows)
    assert pooled["loss"] == pytest.approx(1.5) and pooled["accuracy"] == pytest.approx(0.4)
    assert pooled["perplexity"] == pytest.approx(math.exp(1.5))


def test_weighted_means_average_each_entry_over_the_rows_that_carry_it():
    rows = [{"client_id": 4.0, "train/loss": 2.0, "train/extra": 5.0}, {"client_id": 7.0, "train/loss": 4.0}]
    assert weighted_means(rows, [1.0, 3.0], {"client_id"}) == {
        "train/loss": pytest.approx(3.5),  # (1 * 2 + 3 * 4) / 4
        "train/extra": pytest.approx(5.0),  # the one row that has it
    }
    assert weighted_means([{"x": 2.0}], [0.0]) == {"x": 0.0}
    with pytest.raises(ValueError):  # a weight for every row
        weighted_means(rows, [1.0])


def test_client_summary_weights_by_examples_and_spreads_over_clients():
    out = summarize_clients(
        [{"accuracy": 1.0, "loss": 0.0, "num_examples": 3}, {"accuracy": 0.0, "loss": 2.0, "num_examples": 1}]
    )
    assert out["eval/clients/accuracy"] == pytest.approx(0.75)  # (3*1 + 1*0) / 4
    assert out["eval/clients/accuracy_mean"] == pytest.approx(0.5)
    assert out["eval/clients/accuracy_std"] == pytest.approx(0.5)
    assert out["eval/clients/loss"] == pytest.approx(0.5)
    assert out["eval/clients/num_clients"] == 2


def test_a_rows_scores_go_under_the_prefix_without_its_sums_or_size():
    row = {"accuracy": 0.5, "loss": 1.25, "num_examples": 8.0}
    assert scored("eval/central", row) == {"eval/central/accuracy": 0.5, "eval/central/loss": 1.25}
    assert scored("eval/central", None) == {}  # no such data
