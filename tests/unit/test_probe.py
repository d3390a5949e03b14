"""Probe configuration and the probes' driver-side summaries, against hand values."""

import numpy as np
import pytest

from raysim.config import JobConfig
from raysim.errors import ConfigError
from raysim.measure.barrier import LocalAccuracy
from raysim.probe import ProbeConfig, ProbeRound, is_due
from raysim.runtime.backend import by_point, chunk, map_units
from raysim.services import EVALUATE, MapRequest

BASE = {
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def job(**sections):
    return JobConfig.from_dict(BASE | sections)


def test_probes_are_validated_with_their_own_options():
    config = job(
        evaluation={"probes": [{"name": "client_server_barrier", "every": 5, "pure_aggregate": False}]}
    )
    [probe] = config.evaluation.probes
    assert probe.name == "client_server_barrier" and probe.config.every == 5
    assert config.to_dict()["evaluation"]["probes"] == [
        {"name": "client_server_barrier", "every": 5, "pure_aggregate": False}
    ]
    with pytest.raises(ConfigError, match=r"evaluation.probes\[0\].evry: unknown key; did you mean 'every'"):
        job(evaluation={"probes": [{"name": "local_accuracy", "evry": 2}]})
    unknown = r"evaluation.probes\[0\].name: unknown probe 'barier'.*client_server_barrier"
    with pytest.raises(ConfigError, match=unknown):
        job(evaluation={"probes": [{"name": "barier"}]})


def test_keys_that_moved_to_the_evaluation_section_say_where_they_went():
    with pytest.raises(ConfigError) as info:
        job(engine={"eval_every": 2, "barrier_every": 5})
    problems = " ".join(info.value.problems)
    assert "engine.eval_every: moved to evaluation.every" in problems
    assert "engine.barrier_every: moved to evaluation.probes" in problems


def test_a_probe_is_due_after_every_kth_round():
    probe = LocalAccuracy(ProbeConfig(every=3))
    assert [r for r in range(9) if is_due(probe, r)] == [2, 5, 8]


def test_local_accuracy_weights_clients_by_their_test_examples():
    """Clients with 3 and 1 test examples at accuracy 1 and 0: weighted 0.75, mean 0.5; a client
    without a test split (an empty row) is left out."""
    rows = [
        {"client_id": 1.0, "accuracy": 1.0, "loss": 0.2, "num_examples": 3.0},
        {"client_id": 2.0, "accuracy": 0.0, "loss": 1.0, "num_examples": 1.0},
        {"client_id": 3.0},
    ]
    round_view = ProbeRound(round_num=0, rows=rows, broadcast={}, global_params={})
    out = LocalAccuracy(ProbeConfig()).summarize(round_view, services=None)
    assert out["local/test_accuracy"] == pytest.approx(0.75)
    assert out["local/test_accuracy_mean"] == pytest.approx(0.5)
    assert out["local/test_loss"] == pytest.approx((3 * 0.2 + 1.0) / 4)


def test_local_accuracy_pools_scores_from_the_clients_statistics():
    """Confusion counts [[2, 0], [0, 1]] (MCC 1) and [[0, 1], [1, 0]] (MCC -1) pool to
    [[2, 1], [1, 1]]: MCC = (3 * 5 - (3 * 3 + 2 * 2)) / sqrt((25 - 13) * (25 - 13)) = 1/6, the
    mean of the clients' values 0. Rows without accuracy (regression) log none."""
    rows = [
        {"client_id": 1.0, "loss": 0.2, "mcc": 1.0, "num_examples": 3.0}
        | {"sums/confusion/0_0": 2.0, "sums/confusion/1_1": 1.0},
        {"client_id": 2.0, "loss": 1.0, "mcc": -1.0, "num_examples": 2.0}
        | {"sums/confusion/0_1": 1.0, "sums/confusion/1_0": 1.0},
    ]
    out = LocalAccuracy(ProbeConfig()).summarize(ProbeRound(0, rows, {}, {}), services=None)
    assert out == {
        "local/test_loss": pytest.approx((3 * 0.2 + 2 * 1.0) / 5),
        "local/test_loss_mean": pytest.approx(0.6),
        "local/test_mcc": pytest.approx(1 / 6),
        "local/test_mcc_mean": 0.0,
    }


def test_map_work_is_split_into_contiguous_chunks_and_reassembled_by_point():
    request = MapRequest(EVALUATE, [{}, {}], (10, 11, 12))  # two points on three clients
    units = map_units(request)
    assert units == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    parts = chunk(units, 4)
    assert sorted(len(p) for p in parts) == [1, 1, 2, 2] and sum(parts, []) == units
    flat = [f"{p}-{c}" for p, c in units]
    assert by_point(request, flat) == [["0-0", "0-1", "0-2"], ["1-0", "1-1", "1-2"]]
    central = MapRequest(EVALUATE, [{}, {}, {}], None)
    assert map_units(central) == [(0, 0), (1, 0), (2, 0)]
    assert np.array_equal(np.array(by_point(central, ["a", "b", "c"])), [["a"], ["b"], ["c"]])


def test_transfer_datasets_are_validated_with_the_job():
    """Checked at load, not after the training store is built (hours for C4)."""
    with pytest.raises(ConfigError, match=r"evaluation.transfer\[0\].dataset.name: unknown dataset 'digitz'"):
        job(evaluation={"transfer": [{"name": "t", "dataset": {"name": "digitz"}}]})


def test_the_pure_aggregate_is_guessed_only_from_a_weighted_mean():
    """A dict keyed like the params is a mean delta only when a WeightedMean made it."""
    import torch

    from raysim.aggregate import Sum, WeightedMean
    from raysim.plugin_defaults import pseudo_gradient

    class Plugin:
        def __init__(self, aggregator):
            self._aggregator = aggregator

        def aggregator(self):
            return self._aggregator

    params, aggregate = {"w": torch.ones(2)}, {"w": torch.full((2,), 0.5)}
    assert pseudo_gradient(Plugin(WeightedMean()), aggregate, params) is aggregate
    assert pseudo_gradient(Plugin(Sum()), aggregate, params) is None
