"""A worker's reads from its device: finiteness checks queued until the round's end, and metrics
read back all at once (``raysim.runtime.device_reads``)."""

import math

import pytest
import torch

from raysim.errors import NonFiniteError
from raysim.runtime.device_reads import RetrainRound, RoundChecks, UnreadClient, read_clients
from raysim.types import ClientResult, TrainedClient


def result(value: float, state: object | None = None, weight: float = 1.0) -> ClientResult:
    return ClientResult({"w": torch.full((3,), value)}, weight, state=state)


def test_queued_checks_raise_nothing_until_settled_then_ask_for_the_round_again():
    checks = RoundChecks(defer=True)
    checks.check(result(1.0))
    checks.check(result(math.nan))  # queued: no read yet, no error yet
    checks.check(result(2.0))
    with pytest.raises(RetrainRound):
        checks.settle()


def test_settled_finite_checks_pass_and_clear():
    checks = RoundChecks(defer=True)
    for v in (1.0, -3.0, 1e30):
        checks.check(result(v))
    checks.settle()
    checks.settle()  # nothing left


def test_an_infinite_weight_is_known_at_once_and_asks_for_the_round_again():
    with pytest.raises(RetrainRound):
        RoundChecks(defer=True).check(result(1.0, weight=math.inf))


def test_a_result_with_state_settles_the_queue_and_ends_queueing():
    """Its state is kept at once, so no client before it may be trained again."""
    checks = RoundChecks(defer=True)
    checks.check(result(math.inf))
    with pytest.raises(RetrainRound):
        checks.check(result(1.0, state="kept"))
    checks = RoundChecks(defer=True)
    checks.check(result(1.0, state="kept"))
    assert not checks.defer
    with pytest.raises(NonFiniteError, match=r"\['w'\]"):  # checked at once from now, named
        checks.check(result(math.nan))


def test_checks_not_deferred_name_the_tensors_at_once():
    with pytest.raises(NonFiniteError, match=r"\['w'\]"):
        RoundChecks(defer=False).check(result(math.nan))


def test_read_clients_reads_weights_and_metrics_as_floats_in_their_places():
    clients = [
        UnreadClient(
            3, 2.0, 0.5, {"train/loss": torch.tensor(0.25, dtype=torch.float64), "train/steps": 3.0}
        ),
        UnreadClient(
            7,
            torch.tensor(4.0),
            1.5,
            {"train/loss": torch.tensor(1.5), "train/accuracy": torch.tensor([0.75])},
        ),
    ]
    read = read_clients(clients)
    assert read == [
        TrainedClient(3, 2.0, 0.5, {"train/loss": 0.25, "train/steps": 3.0}),
        TrainedClient(7, 4.0, 1.5, {"train/loss": 1.5, "train/accuracy": 0.75}),
    ]
    assert all(type(v) is float for c in read for v in (c.weight, *c.metrics.values()))
    assert read_clients([UnreadClient(1, 1.0, 0.0, {})]) == [TrainedClient(1, 1.0, 0.0, {})]
