"""The "Local" baseline: a client trains its own model, kept in its state; nothing is aggregated.

Client: from its kept model (else the broadcast initial one), one full-batch SGD step,
w1 = w0 - lr * g(w0), checked against the numpy reference. Rounds: a fake ``Services`` records
what the plugin broadcasts and returns chosen evaluation rows, so the bookkeeping (who has a model,
when the initial model travels, the reported means) is checked by hand. End to end through the
engine: tests/integration/algorithms/test_moon_feddyn_fednova_local_run.py.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad, payload, plugin_types

from raysim import registry
from raysim.engine.metrics import round_metrics
from raysim.errors import NonFiniteError
from raysim.services import RoundOptions
from raysim.types import Payload, RoundOutput, RunInfo, TrainedClient

LR = 0.3
X, Y = np.array([[1.0, 2.0], [-0.5, 1.0]]), np.array([0, 1])
OWN_W, OWN_B = np.array([[0.2, 0.1], [-0.3, 0.4]]), np.array([0.0, 0.1])


def algo(**local):
    entry = registry.get("algorithm", "local")
    return entry.factory(entry.config.model_validate({"local": {"lr": LR, "batch_size": 8} | local}))


def own_state():
    return algo().ClientState({"weight": torch.tensor(OWN_W).float(), "bias": torch.tensor(OWN_B).float()})


def test_a_client_trains_on_from_its_own_model():
    result = algo().client_update(context(X, Y, payload(), state=own_state()))
    gw, gb = grad(OWN_W, OWN_B, X, Y)
    assert np.allclose(result.state.params["weight"].numpy(), OWN_W - LR * gw, atol=1e-6)
    assert np.allclose(result.state.params["bias"].numpy(), OWN_B - LR * gb, atol=1e-6)
    assert result.update == {} and result.weight == 2.0  # nothing travels up


def test_a_new_client_starts_from_the_broadcast_initial_model():
    result = algo().client_update(context(X, Y, payload()))
    gw, _ = grad(W0, B0, X, Y)
    assert np.allclose(result.state.params["weight"].numpy(), W0 - LR * gw, atol=1e-6)


def test_a_new_client_under_an_empty_broadcast_is_an_error():
    with pytest.raises(RuntimeError, match="no model of its own"):
        algo().client_update(context(X, Y, Payload({})))


def test_a_diverged_local_model_is_refused_before_it_is_kept():
    with pytest.raises(NonFiniteError, match="NaN or infinity"):
        algo(lr=1e38, epochs=50).client_update(context(X * 1e6, Y, payload()))


class FakeServices:
    """What the plugin's rounds ask of the engine, with canned evaluation rows."""

    def __init__(self, cohorts, central, own, eval_rounds=(0, 1), num_clients=3):
        self.info = RunInfo(num_clients, cohort_size=2, num_rounds=len(cohorts), spec=SPEC, seed=0)
        self.start_round = 0
        self.cohorts, self.central, self.own, self.eval_rounds = cohorts, central, own, eval_rounds
        self.payloads, self.logged, self.asked, self.recalled = [], [], [], []

    def cohort(self, round_num):
        return np.array(self.cohorts[round_num])

    def train_cohort(self, payload, cohort, round_num, options=RoundOptions()):
        keep_local_models = options.keep_local_models
        assert keep_local_models == self.is_eval_round(round_num)  # only when they are evaluated
        if payload.extra is not None:  # Recall: kept models read back, nothing trained
            assert not payload.params and round_num == self.info.num_rounds - 1
            self.recalled.append([int(c) for c in cohort])
        else:
            self.payloads.append(payload)
        models = {int(c): {"weight": np.full((2, 2), float(c), np.float32)} for c in cohort}
        models = models if keep_local_models else {}
        clients = [TrainedClient(int(c), 1.0 + c, 0.0, {"train/loss": 1.0 + c}) for c in cohort]
        return RoundOutput(aggregate={}, clients=clients, local_models=models)

    def round_metrics(self, output, payload):
        return round_metrics(output, payload)

    def is_eval_round(self, round_num):
        return round_num in self.eval_rounds

    def map_clients(self, request):
        ids = [int(p["weight"][0, 0]) for p in request.points]  # the fake models carry their client id
        clients = None if request.clients is None else list(request.clients)
        self.asked.append((clients, request.paired, ids))
        if clients is None:
            return [[self.central[i]] for i in ids]
        return [[self.own[i] for i in ids]]

    def end_round(self, state, round_num, metrics):
        self.logged.append((round_num, metrics))
        return metrics


def test_the_initial_model_travels_only_while_a_cohort_client_has_none():
    plugin = algo()
    services = FakeServices([[0, 1], [1, 0], [1, 2]], central={}, own={}, eval_rounds=())
    state = plugin.init({"weight": torch.zeros(2, 2)}, services.info)
    final = plugin.protocol(services, state)
    assert [bool(p.params) for p in services.payloads] == [True, False, True]
    assert final.extra.trained.tolist() == [0, 1, 2]
    assert torch.equal(final.params["weight"], state.params["weight"])  # the global model stays
    # client metrics weighted like the round loop's: (1*1 + 2*2) / (1 + 2)
    assert services.logged[0][1]["train/loss"] == pytest.approx(5 / 3)
    assert services.logged[1][1]["sys/bytes_down"] == 0.0


def test_local_models_are_evaluated_when_due():
    central = {0: {"accuracy": 0.5, "loss": 1.0, "num_examples": 9.0}, 1: {"accuracy": 0.7, "loss": 0.6}}
    own = {
        0: {"accuracy": 1.0, "loss": 0.1, "num_examples": 1.0},
        1: {"accuracy": 0.4, "loss": 0.9, "num_examples": 3.0},
    }
    services = FakeServices([[1, 0], [0, 1]], central, own, eval_rounds=(1,))
    plugin = algo()
    plugin.protocol(services, plugin.init({"weight": torch.zeros(2, 2)}, services.info))
    first, second = (m for _, m in services.logged)
    assert not any(k.startswith("eval/local") for k in first)
    assert services.asked == [(None, False, [0, 1]), ([0, 1], True, [0, 1])]  # one point per client
    assert second["eval/local/accuracy"] == pytest.approx(0.6)
    assert second["eval/local/loss"] == pytest.approx(0.8)
    assert second["eval/local/clients/accuracy"] == pytest.approx((1.0 * 1 + 0.4 * 3) / 4)
    assert second["eval/local/clients/accuracy_mean"] == pytest.approx(0.7)
    assert second["eval/local/clients/loss_mean"] == pytest.approx(0.5)


def test_after_the_last_round_every_client_with_a_model_is_evaluated():
    """Round 0 trains 0 and 1, round 1 (the last) trains 2 and 3; client 4 never trained. The
    last evaluation covers 0..3: 2 and 3 from the round, 0 and 1 read back from their state in
    one recall of a cohort's size (2); round 0's covers its cohort only."""
    central = {c: {"accuracy": 0.1 * c, "loss": 1.0 + c, "num_examples": 5.0} for c in range(4)}
    own = {c: {"accuracy": 0.2 * c, "loss": 2.0 - 0.5 * c, "num_examples": 1.0 + c} for c in range(4)}
    services = FakeServices([[0, 1], [3, 2]], central, own, eval_rounds=(0, 1), num_clients=5)
    plugin = algo()
    plugin.protocol(services, plugin.init({"weight": torch.zeros(2, 2)}, services.info))
    (_, first), (_, last) = services.logged
    assert services.recalled == [[0, 1]]
    assert first["eval/local/num_clients"] == 2 and first["eval/local/accuracy"] == pytest.approx(0.05)
    assert last["eval/local/num_clients"] == 4 and last["eval/local/clients/num_clients"] == 4
    assert last["eval/local/accuracy"] == pytest.approx(np.mean([0.0, 0.1, 0.2, 0.3]))
    assert last["eval/local/loss"] == pytest.approx(2.5)
    n = np.array([1.0, 2.0, 3.0, 4.0])
    assert last["eval/local/clients/accuracy"] == pytest.approx((0.2 * np.arange(4) * n).sum() / n.sum())


def test_a_recalled_client_loads_its_kept_model_and_trains_nothing():
    ctx = context(X, Y, Payload({}, plugin_types(algo()).Recall()), state=own_state())
    result = algo().client_update(ctx)
    assert result.update == {} and result.weight == 0.0 and result.state is None
    np.testing.assert_allclose(ctx.model.weight.detach().numpy(), OWN_W, atol=1e-7)
    with pytest.raises(RuntimeError, match="has none"):
        algo().client_update(context(X, Y, Payload({}, plugin_types(algo()).Recall())))


def test_the_authors_code_starts_each_client_from_its_own_random_model():
    """init: client: a new client loads the worker's ``client_init`` weights (here OWN), never
    the broadcast, and no round broadcasts anything."""
    entry = registry.get("algorithm", "local")
    plugin = entry.factory(
        entry.config.model_validate({"start_from": "client_init", "local": {"lr": LR, "batch_size": 8}})
    )
    own = own_state().params
    ctx = replace(context(X, Y, payload()), client_init=lambda: own)
    result = plugin.client_update(replace(ctx, global_params={}, payload=Payload({})))
    gw, gb = grad(OWN_W, OWN_B, X, Y)
    assert np.allclose(result.state.params["weight"].numpy(), OWN_W - LR * gw, atol=1e-6)
    assert np.allclose(result.state.params["bias"].numpy(), OWN_B - LR * gb, atol=1e-6)
    services = FakeServices([[0, 1], [1, 2]], central={}, own={}, eval_rounds=())
    plugin.protocol(services, plugin.init({"weight": torch.zeros(2, 2)}, services.info))
    assert [p.params for p in services.payloads] == [{}, {}]
    with pytest.raises(RuntimeError, match="client_init"):
        plugin.client_update(context(X, Y, Payload({})))


def test_without_a_central_test_set_only_the_clients_own_splits_are_reported():
    own = {0: {"accuracy": 1.0, "loss": 0.1, "num_examples": 1.0}, 1: None}  # client 1: no test split
    services = FakeServices([[0, 1]], {0: None, 1: None}, own)
    plugin = algo()
    plugin.protocol(services, plugin.init({"weight": torch.zeros(2, 2)}, services.info))
    metrics = services.logged[0][1]
    assert "eval/local/accuracy" not in metrics
    assert metrics["eval/local/clients/accuracy"] == 1.0 and metrics["eval/local/clients/num_clients"] == 1


def test_the_local_models_scores_pool_their_clients_statistics():
    """MCC from the summed confusion counts, by hand (test_scores.py's): [[3, 1], [0, 0]] and
    [[0, 0], [1, 3]] pool to MCC 0.5, while each client alone scores 0; rows without accuracy
    (a regression task's) log none."""
    a = {"loss": 0.5, "mcc": 0.0, "num_examples": 4.0, "sums/confusion/0_0": 3.0, "sums/confusion/0_1": 1.0}
    b = {"loss": 0.7, "mcc": 0.0, "num_examples": 4.0, "sums/confusion/1_0": 1.0, "sums/confusion/1_1": 3.0}
    services = FakeServices([[0, 1]], {0: a, 1: b}, {0: a, 1: b})
    plugin = algo()
    plugin.protocol(services, plugin.init({"weight": torch.zeros(2, 2)}, services.info))
    metrics = services.logged[0][1]
    assert metrics["eval/local/clients/mcc"] == pytest.approx(0.5)
    assert metrics["eval/local/clients/mcc_mean"] == 0.0 and metrics["eval/local/mcc"] == 0.0
    assert metrics["eval/local/clients/loss"] == pytest.approx(0.6)
    assert not any("accuracy" in key or "sums/" in key for key in metrics)


def test_resumed_state_keeps_who_has_a_model():
    plugin = algo()
    services = FakeServices([[0, 1], [1, 0]], central={}, own={}, eval_rounds=())
    state = plugin.init({"weight": torch.zeros(2, 2)}, services.info)
    resumed = replace(state, extra=plugin_types(plugin).TrainedClients(torch.tensor([0, 1])))
    services.start_round = 1
    plugin.protocol(services, resumed)
    assert [bool(p.params) for p in services.payloads] == [False]
