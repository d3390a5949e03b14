"""A trained cohort's metrics (``round_metrics``, the ``Services.round_metrics`` verb): client
metrics averaged by client weight, the payload's and the updates' bytes, the failed clients; and
the round loop's timing of its round."""

from dataclasses import dataclass

import numpy as np
import pytest

from raysim.engine.metrics import round_metrics, round_timing
from raysim.types import ClientFailure, Payload, RoundOutput, TrainedClient, WorkerTimes


@dataclass(frozen=True)
class Extra:
    anchor: np.ndarray
    step: int


def test_a_metric_some_clients_report_is_averaged_over_those_clients():
    """Weights 1 and 3 report train/loss 2 and 4: (1*2 + 3*4) / 4 = 3.5. Only the first reports
    clip/norm 0.5: its mean is 0.5, not 0.5 * 1 / 4 (the weight of every client)."""
    clients = [
        TrainedClient(0, 1.0, 0.1, {"train/loss": 2.0, "clip/norm": 0.5}),
        TrainedClient(1, 3.0, 0.1, {"train/loss": 4.0}),
    ]
    out = round_metrics(RoundOutput(None, clients), Payload({}))
    assert out["train/loss"] == pytest.approx(3.5)
    assert out["clip/norm"] == pytest.approx(0.5)


def test_a_cohorts_metrics_are_its_clients_means_bytes_and_failures_and_no_bookkeeping():
    """Three clients got the payload (two trained, one failed): the params (6 float32 = 24 bytes)
    and the extra's anchor (4 float32 = 16 bytes) go to each of the 3, client 5's own part (7
    float32 = 28 bytes) to it alone: 24 * 3 + 16 * 3 + 28 = 148 bytes down."""
    clients = [
        TrainedClient(4, 2.0, 9.0, {"train/loss": 1.0, "train/accuracy": 0.5}),
        TrainedClient(5, 6.0, 9.0, {"train/loss": 3.0, "train/accuracy": 0.25}),
    ]
    failures = [ClientFailure(6, 2, ValueError("nan"), stage="update_check")]
    payload = Payload(
        {"w": np.zeros((2, 3), np.float32)},
        Extra(np.zeros(4, np.float32), 1),
        per_client={5: {"peer": np.zeros(7, np.float32)}},
    )
    out = round_metrics(RoundOutput(None, clients, failures, bytes_up=40), payload)
    assert out == {
        "train/loss": (2 * 1.0 + 6 * 3.0) / 8,  # 2.5
        "train/accuracy": (2 * 0.5 + 6 * 0.25) / 8,  # 0.3125
        "sys/bytes_down/params": 72.0,
        "sys/bytes_down/anchor": 48.0,
        "sys/bytes_down/step": 0.0,  # a number, no array: it weighs nothing here
        "sys/bytes_down/per_client": 28.0,
        "sys/bytes_down": 148.0,
        "sys/bytes_up": 40.0,
        "sys/failed_clients": 1.0,
        "sys/nonfinite_clients": 1.0,
    }


def test_encoded_params_weigh_their_message_once_per_client():
    """compression.download: the params weigh ``params_bytes`` (their encoded message), not 4 * 6."""
    payload = Payload({"w": np.zeros((2, 3), np.float32)}, Extra(np.zeros(4, np.float32), 1), params_bytes=5)
    clients = [TrainedClient(c, 1.0, 0.1, {}) for c in range(3)]
    out = round_metrics(RoundOutput(None, clients), payload)
    assert out["sys/bytes_down/params"] == 15.0 and out["sys/bytes_down"] == 15.0 + 48.0


def test_clients_whose_weights_are_all_zero_average_to_zero():
    out = round_metrics(RoundOutput(None, [TrainedClient(0, 0.0, 0.0, {"train/loss": 5.0})]), Payload({}))
    assert out["train/loss"] == 0.0


def test_the_round_timing_says_how_the_workers_shared_the_round():
    """Two workers busy 1 s and 3 s in a 4 s round: the slowest took 3, the mean 2 (imbalance 1.5),
    and the driver's own part is the 1 s the slowest worker did not take."""
    output = RoundOutput(
        None,
        [TrainedClient(c, 1.0, 0.5) for c in range(8)],
        worker_times=[WorkerTimes(1.0), WorkerTimes(3.0)],
    )
    assert round_timing(output, 4.0) == {
        "sys/round_s": 4.0,
        "sys/clients_per_s": 2.0,
        "sys/worker_imbalance": 1.5,
        "sys/worker_busy_s": 3.0,
        "sys/driver_overhead_s": 1.0,
        "sys/num_workers": 2.0,
    }
