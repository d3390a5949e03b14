"""Probes and the engine's verbs end to end: map_clients, kept local models, the pure-aggregate
barrier, evaluation at the start, empty broadcasts, resume_state, per-key bytes down.

Expected values come from plain torch on the same weights and data, not from the code under test.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

from jobs import tiny_job
from raysim import params as P
from raysim import registry
from raysim.engine.build import build
from raysim.engine.loop import START_STEP, run
from raysim.errors import CheckpointError, ConfigError
from raysim.probe import ProbeConfig
from raysim.runtime.builders import build_job_model
from raysim.services import EVALUATE, FEATURES, LOGITS, MapRequest, RoundOptions
from raysim.tracking.tracker import MemoryTracker
from raysim.types import Payload

BARRIER = {"probes": [{"name": "client_server_barrier"}]}


def built(job, tmp_path):
    engine, state = build(job, MemoryTracker(), None, tmp_path)
    return engine, state


def direct(job, store, params, client_id, model_section=None):
    """Loss, accuracy and logits of ``params`` on a client's test split, in plain torch."""
    model = build_job_model(job, store.spec) if model_section is None else _model(model_section, store)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()}, strict=False)
    model.eval()
    data = store.client_data(client_id, "test").arrays
    x, y = torch.as_tensor(data["x"]), torch.as_tensor(data["y"])
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).float().mean().item(), logits.numpy()


def _model(section, store):
    from raysim.models import build_model

    entry = registry.get("model", section["name"])
    return build_model(entry.name, entry.config.model_validate({"hidden": section["hidden"]}), store.spec)


@pytest.mark.parametrize("backend", ["serial", "ray"])
def test_map_clients_evaluates_every_point_on_every_client(tmp_path, backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_local")
    job = tiny_job(resources={"backend": backend, "num_workers": 2})
    engine, state = built(job, tmp_path)
    try:
        start = P.to_numpy(state.params)
        halved = {k: v * 0.5 for k, v in start.items()}
        clients = [0, 3, 7]
        metrics = engine.map_clients(MapRequest(EVALUATE, [start, halved], clients))
        logits = engine.map_clients(MapRequest(LOGITS, [halved], clients))
    finally:
        engine.backend.shutdown()
    assert len(metrics) == 2 and all(len(row) == 3 for row in metrics)
    for p, point in enumerate([start, halved]):
        for c, client in enumerate(clients):
            loss, accuracy, out = direct(job, engine.store, point, client)
            assert metrics[p][c]["loss"] == pytest.approx(loss, rel=1e-5)
            assert metrics[p][c]["accuracy"] == pytest.approx(accuracy)
            if p == 1:
                np.testing.assert_allclose(logits[0][c], out, rtol=1e-5, atol=1e-6)


def test_map_clients_returns_the_models_features(tmp_path):
    """``features`` is the penultimate representation (models/anatomy), example by example."""
    job = tiny_job()
    engine, state = built(job, tmp_path)
    [[features]] = engine.map_clients(MapRequest(FEATURES, [P.to_numpy(state.params)], [2]))
    model = build_job_model(job, engine.store.spec)
    model.load_state_dict(state.params, strict=False)
    model.eval()
    with torch.no_grad():
        expected = model.features(torch.as_tensor(engine.store.client_data(2, "test").arrays["x"]))
    assert features.shape == (len(engine.store.client_data(2, "test")), 16)  # the MLP's hidden width
    np.testing.assert_allclose(features, expected.numpy(), rtol=1e-6)


def test_map_clients_loads_points_into_another_architecture(tmp_path):
    """A plugin that composes its own network (FuseFL) evaluates it through the same verb."""
    job = tiny_job()
    engine, _ = built(job, tmp_path)
    section = {"name": "mlp", "hidden": [8]}
    torch.manual_seed(11)
    other = P.to_numpy(P.model_params(_model(section, engine.store)))
    [[row]] = engine.map_clients(MapRequest(EVALUATE, [other], [5], model=section))
    loss, _, _ = direct(job, engine.store, other, 5, section)
    assert row["loss"] == pytest.approx(loss, rel=1e-5)
    [[central]] = engine.map_clients(MapRequest(EVALUATE, [other], None, model=section))
    assert central is None or central["num_examples"] > 0  # digits has no central set: None


def test_kept_local_models_average_to_the_fedavg_model(tmp_path):
    """FedAvg (server SGD, lr 1): new global = sum_i w_i local_i / sum_i w_i over the cohort."""
    engine, state = built(tiny_job(), tmp_path)
    cohort = engine.cohort(0)
    payload = engine.algorithm.payload(state, 0, engine.info)
    output = engine.train_cohort(payload, cohort, 0, RoundOptions(keep_local_models=True))
    new, _ = engine.algorithm.server_update(state, output.aggregate, 0, engine.info)
    weights = {client.client_id: client.weight for client in output.clients}
    assert sorted(output.local_models) == sorted(int(c) for c in cohort)
    for key, value in new.params.items():
        mean = sum(weights[c] * output.local_models[c][key] for c in weights) / sum(weights.values())
        np.testing.assert_allclose(value.numpy(), mean, rtol=1e-5, atol=1e-6)


def test_the_pure_aggregate_barrier_is_the_barrier_without_the_server_optimizer(tmp_path):
    fedavg = run(tiny_job(evaluation=BARRIER), output_dir=tmp_path / "a").final
    assert fedavg["barrier/pure/loss"] == pytest.approx(fedavg["barrier/loss"], abs=1e-6)  # server lr 1
    adam = run(tiny_job(algorithm={"name": "fedadam"}, evaluation=BARRIER), output_dir=tmp_path / "b").final
    assert adam["barrier/pure/local_loss"] == adam["barrier/local_loss"]  # same clients, same data
    assert adam["barrier/pure/global_loss"] != pytest.approx(adam["barrier/global_loss"], abs=1e-4)


def test_local_accuracy_probe_reports_local_models_on_their_test_splits(tmp_path):
    job = tiny_job(evaluation={"probes": [{"name": "local_accuracy", "every": 2}]}, engine={"num_rounds": 4})
    history = run(job, output_dir=tmp_path).history
    assert [step for step, m in history if "local/test_accuracy" in m] == [1, 3]
    assert 0.1 < history[-1][1]["local/test_accuracy"] <= 1  # 10 classes: chance is 0.1


def test_evaluation_at_start_logs_the_initial_model_at_step_minus_one(tmp_path, tracking_uri):
    job = tiny_job(evaluation={"every": 1, "at_start": True}, tracking={"enabled": True, "experiment": "s"})
    engine, state = built(job, tmp_path / "x")
    expected = engine.evaluate(state)["eval/clients/accuracy"]
    engine.backend.shutdown()
    result = run(job, output_dir=tmp_path / "y")
    assert result.history[0][0] == START_STEP
    assert result.history[0][1]["eval/clients/accuracy"] == pytest.approx(expected)
    steps = [
        m.step for m in MlflowClient(tracking_uri).get_metric_history(result.run_id, "eval/clients/accuracy")
    ]
    assert steps == [START_STEP, 0, 1, 2]


class SendsNoParams:
    """FedAvg whose weights travel in ``payload.extra``: the broadcast itself is empty (a test plugin)."""

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def payload(self, state, round_num, info):
        return Payload({}, extra={"weights": P.to_numpy(state.params)})

    def client_update(self, ctx):
        P.load_into(ctx.model, ctx.payload.extra["weights"])  # the plugin owns the model's weights
        inner = Payload(ctx.payload.extra["weights"])
        return self.inner.client_update(_with_payload(ctx, inner))


def _with_payload(ctx, payload):
    from dataclasses import replace

    return replace(ctx, payload=payload, global_params=P.from_numpy(payload.params))


def test_an_empty_broadcast_leaves_the_weights_to_the_plugin(tmp_path):
    registry.register("algorithm", "sends_no_params_test", config=registry.get("algorithm", "fedavg").config)(
        SendsNoParams
    )
    plain = run(tiny_job(), output_dir=tmp_path / "a")
    empty = run(tiny_job(algorithm={"name": "sends_no_params_test"}), output_dir=tmp_path / "b")
    for key, value in plain.state.params.items():
        assert torch.allclose(value, empty.state.params[key], atol=1e-6), key
    assert empty.final["sys/bytes_down/params"] == 0
    assert empty.final["sys/bytes_down/weights"] == empty.final["sys/bytes_down"] > 0


class WithWindow:
    """FedAvg plus plugin state an older checkpoint lacks (IMA's window), filled on resume."""

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def init(self, params, info):
        from dataclasses import replace

        return replace(self.inner.init(params, info), extra={"window": []})

    def resume_state(self, saved, fresh, trail):
        from dataclasses import replace

        return replace(saved, extra={**fresh.extra, **(saved.extra or {})})  # None: FedAvg keeps none


class CountsFromStart:
    """A staged plugin that runs standard rounds from ``services.start_round`` (a test plugin)."""

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def protocol(self, services, state):
        for round_num in range(services.start_round, services.info.num_rounds):
            state, metrics = services.run_round(state, round_num)
            services.end_round(state, round_num, metrics)  # evaluate, log, checkpoint when due
        return state


def test_a_resumed_staged_plugin_continues_where_its_checkpoint_ended(tmp_path):
    registry.register("algorithm", "counts_test", config=registry.get("algorithm", "fedavg").config)(
        CountsFromStart
    )
    job = tiny_job(algorithm={"name": "counts_test"}, engine={"num_rounds": 4, "checkpoint_every": 2})
    whole = run(job, output_dir=tmp_path / "a")
    assert all("eval/clients/accuracy" in m for _, m in whole.history)  # evaluation.every: 1
    checkpoint = str(whole.run_dir / "checkpoints" / "round_00001.pt")
    resumed = run(job, resume_from=checkpoint, output_dir=tmp_path / "b")
    assert [s for s, _ in resumed.history] == [2, 3]
    for key, value in whole.state.params.items():
        assert torch.equal(value, resumed.state.params[key]), key


def test_resume_state_completes_what_an_older_checkpoint_lacks(tmp_path):
    config = registry.get("algorithm", "fedavg").config
    registry.register("algorithm", "with_window_test", config=config)(WithWindow)
    fedavg = run(tiny_job(engine={"num_rounds": 1}), output_dir=tmp_path / "a")
    checkpoint = str(fedavg.run_dir / "checkpoints" / "final.pt")
    branch = run(
        tiny_job(algorithm={"name": "with_window_test"}),
        resume_from=checkpoint,
        output_dir=tmp_path / "b",
        branch=True,
    )
    assert branch.state.extra == {"window": []} and [s for s, _ in branch.history] == [1, 2]
    with pytest.raises(CheckpointError, match="another kind of algorithm"):
        run(
            tiny_job(algorithm={"name": "scaffold"}),
            resume_from=checkpoint,
            output_dir=tmp_path / "c",
            branch=True,
        )


def test_bytes_down_are_counted_per_payload_part(tmp_path):
    result = run(tiny_job(algorithm={"name": "scaffold"}, engine={"num_rounds": 1}), output_dir=tmp_path)
    params_bytes = sum(v.numel() * 4 for v in result.state.params.values())
    final = result.final
    assert final["sys/bytes_down/params"] == 6 * params_bytes  # cohort of 6
    assert final["sys/bytes_down/c"] == 6 * params_bytes  # SCAFFOLD's server variate, same shapes
    assert final["sys/bytes_down"] == final["sys/bytes_down/params"] + final["sys/bytes_down/c"]


class ModeRecorder:
    """A probe that records how its hooks see the model (a test probe)."""

    Config = ProbeConfig
    keeps_local_models = False

    def __init__(self, config):
        self.config = config

    def _seen(self, view):
        view.model(torch.as_tensor(view.data.arrays["x"][:2]))  # a forward pass of its own
        return {"training": float(view.model.training), "grad": float(torch.is_grad_enabled())}

    def before_training(self, view):
        return {f"before_{k}": v for k, v in self._seen(view).items()}

    def after_training(self, view):
        return {f"after_{k}": v for k, v in self._seen(view).items()}

    def summarize(self, probe_round, services):
        keys = ("before_training", "before_grad", "after_training", "after_grad")
        return {f"mode/{k}": max(row[k] for row in probe_round.rows) for k in keys}


def test_probe_hooks_run_in_eval_mode_without_gradients(tmp_path):
    registry.register("probe", "mode_recorder_test")(ModeRecorder)
    job = tiny_job(evaluation={"probes": [{"name": "mode_recorder_test"}]}, engine={"num_rounds": 1})
    final = run(job, output_dir=tmp_path).final
    assert [
        final[f"mode/{k}"] for k in ("before_training", "before_grad", "after_training", "after_grad")
    ] == [0.0] * 4


def test_a_map_request_is_refused_on_the_driver(tmp_path):
    """A bad split fails as the request is written, a bad model section when it is asked: both on
    the driver, before any worker sees them."""
    engine, state = built(tiny_job(), tmp_path)
    point = [P.to_numpy(state.params)]
    with pytest.raises(ConfigError, match="split must be"):
        MapRequest(EVALUATE, point, [0], split="round")  # no round_num
    with pytest.raises(ConfigError, match="split must be"):
        MapRequest(EVALUATE, point, [0], split="dev")
    with pytest.raises(ConfigError, match="split 'triggered' is the central test set's"):
        MapRequest(EVALUATE, point, [0], split="triggered")
    MapRequest(EVALUATE, point, None, split="triggered")  # dataset.poison's triggered test set
    with pytest.raises(ConfigError, match="map_clients model.hiden: unknown key"):
        engine.map_clients(MapRequest(EVALUATE, point, [0], model={"name": "mlp", "hiden": [8]}))


def test_map_clients_outlives_a_worker_that_died_for_good(tmp_path, ray_local):
    import ray

    job = tiny_job(resources={"backend": "ray", "num_workers": 2})
    engine, state = built(job, tmp_path)
    try:
        point = [P.to_numpy(state.params)]
        before = engine.map_clients(MapRequest(EVALUATE, point, [0, 1, 2, 3]))
        ray.kill(engine.backend.workers[1], no_restart=True)
        after = engine.map_clients(MapRequest(EVALUATE, point, [0, 1, 2, 3]))
        evaluated = engine.evaluate(state, job.engine.num_rounds - 1)  # on the one worker left
    finally:
        engine.backend.shutdown()
    assert engine.backend.dead_workers == 1
    assert [row["loss"] for row in after[0]] == pytest.approx([row["loss"] for row in before[0]])
    assert "eval/clients/accuracy" in evaluated


@pytest.mark.parametrize("backend", ["serial", "ray"])
def test_paired_map_clients_evaluates_each_client_on_its_own_point(tmp_path, backend, request):
    """The "Local" baseline: client i under point i only; the same numbers as the full grid's
    diagonal, at the cost of len(clients) evaluations instead of its square."""
    if backend == "ray":
        request.getfixturevalue("ray_local")
    engine, state = built(tiny_job(resources={"backend": backend, "num_workers": 2}), tmp_path)
    try:
        start = P.to_numpy(state.params)
        points = [{k: v * scale for k, v in start.items()} for scale in (1.0, 0.5, 0.25)]
        clients = [4, 9, 13]
        [paired] = engine.map_clients(MapRequest(EVALUATE, points, clients, paired=True))
        grid = engine.map_clients(MapRequest(EVALUATE, points, clients))
        with pytest.raises(ConfigError, match="one point per client"):
            engine.map_clients(MapRequest(EVALUATE, points[:2], clients, paired=True))
    finally:
        engine.backend.shutdown()
    assert [row["loss"] for row in paired] == pytest.approx([grid[i][i]["loss"] for i in range(3)])
