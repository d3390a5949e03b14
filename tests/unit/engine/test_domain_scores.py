"""Per-domain accuracy of the client evaluation, against hand counts."""

import pytest

from raysim.engine.domain_scores import summarize_domains


def row(client: int, correct: int, total: int) -> dict[str, float]:
    return {
        "client_id": float(client),
        "accuracy": correct / total,
        "loss": 1.0,
        "num_examples": float(total),
    }


def test_each_domain_pools_its_clients_examples_and_the_mean_is_over_domains():
    """Domain "svhn": clients 0 (3 of 4 right) and 2 (1 of 6) -> 4/10. Domain "mnist": client 1
    (9 of 10) -> 0.9. The mean over domains is (0.4 + 0.9) / 2 = 0.65, not the pooled 13/20."""
    rows = [row(0, 3, 4), row(1, 9, 10), row(2, 1, 6)]
    out = summarize_domains(rows, {0: "svhn", 1: "mnist", 2: "svhn"})
    assert out["eval/domain/svhn/accuracy"] == pytest.approx(0.4)
    assert out["eval/domain/mnist/accuracy"] == pytest.approx(0.9)
    assert out["eval/domain/accuracy_mean"] == pytest.approx(0.65)
    assert out["eval/domain/svhn/loss"] == pytest.approx(1.0)
    assert "eval/domain/svhn/num_examples" not in out


def test_no_domains_no_metrics():
    assert summarize_domains([row(0, 1, 2)], {}) == {}
