"""The client-server barrier and time to target, against hand values."""

from dataclasses import replace

import pytest

from raysim.config import TimeToTargetConfig
from raysim.engine.evaluation import TimeToTarget, refuse_nonfinite_losses
from raysim.errors import ConfigError, NonFiniteError
from raysim.measure.barrier import summarize_barrier


def test_barrier_is_the_mean_gap_between_global_and_local_on_each_clients_data():
    """Client 1: global loss 0.9 vs local 0.4 (gap 0.5), client 2: 0.3 vs 0.2 (gap 0.1) -> 0.3.
    Error form: accuracies local 0.9 / 0.8, global 0.6 / 0.7 -> mean(0.3, 0.1) = 0.2."""
    keys = ("client_id", "start_loss", "start_accuracy", "local_loss", "local_accuracy")
    before = [dict(zip(keys, (1.0, 1.0, 0.5, 0.4, 0.9))), dict(zip(keys, (2.0, 0.8, 0.6, 0.2, 0.8)))]
    after = [{"loss": 0.9, "accuracy": 0.6}, {"loss": 0.3, "accuracy": 0.7}]  # aligned with before
    out = summarize_barrier(before, after, "barrier")
    assert out["barrier/loss"] == pytest.approx(0.3)
    assert out["barrier/error"] == pytest.approx(0.2)
    assert out["barrier/start_loss"] == pytest.approx(0.9)
    assert out["barrier/global_loss"] == pytest.approx(0.6)
    assert summarize_barrier(before, [None, None], "barrier") == {}


def test_a_regression_barrier_has_no_accuracy_terms():
    before = [{"client_id": 1.0, "start_loss": 2.0, "local_loss": 0.5}]
    out = summarize_barrier(before, [{"loss": 1.25, "num_examples": 4.0}], "barrier")
    assert out == {
        "barrier/loss": 0.75,
        "barrier/start_loss": 2.0,
        "barrier/local_loss": 0.5,
        "barrier/global_loss": 1.25,
    }


def test_the_personalized_scope_keeps_only_clients_personalization_admits():
    """min_examples 5: client 0 (10 + 2) stays, 1 (2 + 1) is too small, 2 (4 + 3) stays, 3 has no
    test split; the clients of another scope are untouched."""
    import numpy as np

    from raysim.config import PersonalizationConfig
    from raysim.engine.evaluation import EvaluationPlan, keep_personalizable

    num_train, num_test = np.array([10, 2, 4, 3, 1]), np.array([2, 1, 3, 0, 1])
    config = PersonalizationConfig(min_examples=5)
    plan = EvaluationPlan(clients=np.array([4, 1]), heldout=np.array([0, 1, 2, 3]), personalization=config)
    kept = keep_personalizable(plan, num_train, num_test)
    assert kept.heldout.tolist() == [0, 2] and kept.clients.tolist() == [4, 1]
    assert kept.num_skipped == {"eval/heldout": 2}
    nobody_held_out = EvaluationPlan(clients=np.array([0, 1, 2]), heldout=np.array([], np.int64))
    kept = keep_personalizable(replace(nobody_held_out, personalization=config), num_train, num_test)
    assert kept.clients.tolist() == [0, 2] and kept.num_skipped == {"eval/clients": 1}
    assert keep_personalizable(nobody_held_out, num_train, num_test) is nobody_held_out


def test_time_to_target_logs_each_value_once():
    tta = TimeToTarget(TimeToTargetConfig(metric="eval/clients/accuracy", values=[0.5, 0.8]))
    key = "tta/eval/clients/accuracy_{}/{}"
    assert tta.reached({"eval/clients/accuracy": 0.4}, 0, 10.0) == {}
    assert tta.reached({"eval/clients/accuracy": 0.6}, 1, 20.0) == {
        key.format(0.5, "round"): 1.0, key.format(0.5, "sim_s"): 20.0
    }  # fmt: skip
    assert tta.reached({"eval/clients/accuracy": 0.55}, 2, 30.0) == {}
    assert tta.reached({"eval/clients/accuracy": 0.9}, 3, None) == {key.format(0.8, "round"): 3.0}
    loss = TimeToTarget(TimeToTargetConfig(metric="eval/clients/loss", values=[1.0], at_most=True))
    assert loss.reached({"eval/clients/loss": 0.9}, 4, None) == {"tta/eval/clients/loss_1/round": 4.0}
    assert tta.reached_values() == [0.5, 0.8] and loss.reached_values() == [1.0]
    with pytest.raises(ConfigError, match="'eval/clients/loss' is not evaluated.*evaluated: eval/x"):
        TimeToTarget(TimeToTargetConfig(metric="eval/clients/loss", values=[1.0])).reached(
            {"eval/x": 1}, 0, None
        )


def test_time_to_target_restored_from_a_checkpoint_logs_only_the_values_not_reached():
    # an outside review: a resumed run logged a value reached before its checkpoint a second time
    tta = TimeToTarget(TimeToTargetConfig(metric="eval/clients/accuracy", values=[0.5, 0.8]))
    tta.restore([0.5])  # what the checkpoint kept
    assert tta.reached({"eval/clients/accuracy": 0.9}, 4, None) == {
        "tta/eval/clients/accuracy_0.8/round": 4.0
    }
    older = TimeToTarget(TimeToTargetConfig(metric="eval/clients/accuracy", values=[0.5]))
    older.restore(None)  # a checkpoint written before raysim kept them: every value pends
    assert older.reached({"eval/clients/accuracy": 0.6}, 4, None) == {
        "tta/eval/clients/accuracy_0.5/round": 4.0
    }


def test_only_the_global_models_own_nonfinite_losses_stop_a_run():
    finite = {"eval/central/loss": 0.3, "eval/clients/loss": 1e30, "eval/personal/loss": float("nan")}
    refuse_nonfinite_losses(finite, 4)  # a personal or fine-tuned model's loss is not the global one's
    refuse_nonfinite_losses({"eval/transfer/x/loss": float("inf")}, 4)
    with pytest.raises(NonFiniteError, match=r"^round 4: the global model's eval/clients/loss is inf: "):
        refuse_nonfinite_losses({"eval/central/loss": 0.3, "eval/clients/loss": float("inf")}, 4)
    with pytest.raises(NonFiniteError, match=r"^the global model's eval/heldout/loss is nan: .*server\.lr"):
        refuse_nonfinite_losses({"eval/heldout/loss": float("nan")}, None)  # before the first round
