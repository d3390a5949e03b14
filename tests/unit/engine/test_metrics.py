"""Round metrics: client metrics averaged over the clients that report them."""

import pytest

from raysim.engine.metrics import round_metrics
from raysim.types import Payload, RoundOutput


def test_a_metric_some_clients_report_is_averaged_over_those_clients():
    """Weights 1 and 3 report train/loss 2 and 4: (1*2 + 3*4) / 4 = 3.5. Only the first reports
    clip/norm 0.5: its mean is 0.5, not 0.5 * 1 / 4 (the weight of every client)."""
    clients = [
        {"client_id": 0.0, "weight": 1.0, "seconds": 0.1, "train/loss": 2.0, "clip/norm": 0.5},
        {"client_id": 1.0, "weight": 3.0, "seconds": 0.1, "train/loss": 4.0},
    ]
    out = round_metrics(RoundOutput(None, client_metrics=clients), Payload({}), 2, seconds=1.0)
    assert out["train/loss"] == pytest.approx(3.5)
    assert out["clip/norm"] == pytest.approx(0.5)
