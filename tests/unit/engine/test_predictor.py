"""What ``evaluate_weights`` evaluates: one model's rows as the workers give them, an ensemble's
from its members' mean logits, and any predictor summarized as the evaluation plan says."""

import math

import numpy as np
import pytest

from raysim.engine.evaluation import EvaluationPlan, evaluate_predictor
from raysim.engine.predictor import Predictor
from raysim.services import EVALUATE, LABELS, LOGITS

# two members' raw logits for one client's two examples (classes 0 and 1), both labelled 0
MEMBER_LOGITS = [np.array([[2.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 0.0], [0.0, 3.0]])]


class FakeBackend:
    """Canned ``map_clients`` answers; a point is told apart by its ``id`` entry."""

    def __init__(self):
        self.requests = []

    def map_clients(self, request):
        self.requests.append(request)
        clients = [None] if request.clients is None else list(request.clients)
        if request.task == EVALUATE:  # the central test set has 10 examples, client c has c
            return [[_row(10.0 if c is None else float(c)) for c in clients] for _ in request.points]
        if request.task == LOGITS:
            return [[MEMBER_LOGITS[int(p["id"][0])] for _ in clients] for p in request.points]
        if request.task == LABELS:
            return [[np.array([0, 0]) for _ in clients]]
        raise AssertionError(request.task)


def _row(n):
    """Client c's row: accuracy c / 10 over c examples."""
    return {"accuracy": n / 10, "loss": 1.0, "num_examples": n}


def test_an_ensemble_predicts_by_its_members_mean_logits():
    """Mean logits [[1, 0], [0, 2]], labels [0, 0]: the first right, the second wrong (accuracy
    0.5); cross-entropy (log(1 + e^-1) + 2 + log(1 + e^-2)) / 2."""
    members = [{"id": np.array([0])}, {"id": np.array([1])}]
    [row] = Predictor.of(members).rows(FakeBackend(), [3])
    assert row is not None
    assert row["accuracy"] == 0.5 and row["num_examples"] == 2.0
    assert row["loss"] == pytest.approx((math.log1p(math.exp(-1)) + 2 + math.log1p(math.exp(-2))) / 2)


def test_an_ensembles_members_of_two_architectures_are_asked_for_apart():
    members = [{"id": np.array([0])}, {"id": np.array([1])}]
    backend = FakeBackend()
    Predictor.of(members, [{"name": "a"}, {"name": "b"}]).rows(backend, [3])
    assert [(r.task, r.model) for r in backend.requests] == [
        (LOGITS, {"name": "a"}),
        (LOGITS, {"name": "b"}),
        (LABELS, None),
    ]


def test_a_predictor_needs_a_section_per_point():
    with pytest.raises(ValueError, match="one model section per point"):
        Predictor.of([{"id": np.array([0])}], [{"name": "a"}, {"name": "b"}])


def test_any_predictor_is_summarized_as_the_plan_says():
    """Clients 2 and 6 (2 and 6 examples, accuracy 0.2 and 0.6): pooled (2*0.2 + 6*0.6) / 8 = 0.5,
    unweighted 0.4; the central test set's row under eval/central; held-out client 4 apart."""
    plan = EvaluationPlan(clients=np.array([2, 6]), heldout=np.array([4]))
    backend = FakeBackend()
    metrics = evaluate_predictor(backend, Predictor.of([{"id": np.array([0])}], [{"name": "fused"}]), plan)
    assert metrics["eval/central/accuracy"] == 1.0 and "eval/central/num_examples" not in metrics
    assert metrics["eval/clients/accuracy"] == pytest.approx(0.5)
    assert metrics["eval/clients/accuracy_mean"] == pytest.approx(0.4)
    assert metrics["eval/clients/num_clients"] == 2.0
    assert metrics["eval/heldout/accuracy"] == pytest.approx(0.4)
    assert {r.model["name"] for r in backend.requests} == {"fused"}  # every request in its section
    without_heldout = evaluate_predictor(
        FakeBackend(), Predictor.of([{"id": np.array([0])}]), plan, heldout=False
    )
    assert not any(k.startswith("eval/heldout") for k in without_heldout)
