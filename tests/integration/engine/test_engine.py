"""End-to-end engine behaviour: MLflow contents, resume, worker restarts, client failures."""

import pytest
import ray
import torch
from mlflow.tracking import MlflowClient

from jobs import tiny_job
from raysim import registry
from raysim.engine.build import build
from raysim.engine.loop import run
from raysim.errors import CheckpointError, ClientError
from raysim.tracking.tracker import MemoryTracker
from raysim.tracking.tracking_store import artifact_repository


def test_mlflow_run_holds_params_tags_metrics_and_artifacts(tmp_path, tracking_uri, ray_local):
    job = tiny_job(
        resources={"backend": "ray", "num_workers": 2},
        algorithm={"name": "fedavg", "local": {"epochs": 3}},
        tracking={"enabled": True, "experiment": "it"},
    )
    result = run(job, output_dir=tmp_path)
    client = MlflowClient(tracking_uri)
    data = client.get_run(result.run_id).data
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert data.params["algorithm.name"] == "fedavg" and data.params["algorithm.local.lr"] == "0.1"
    assert data.params["dataset.partition.alpha"] == "0.5"
    assert data.tags["algorithm"] == "fedavg" and data.tags["dataset"] == "digits"
    accuracy = client.get_metric_history(result.run_id, "eval/clients/accuracy")
    assert [m.step for m in accuracy] == [0, 1, 2]
    assert accuracy[-1].value > 0.5  # 10 classes: chance is 0.1
    for key in ("train/loss", "sys/round_s", "sys/clients_per_s", "sys/bytes_up", "sys/bytes_down"):
        assert len(client.get_metric_history(result.run_id, key)) == 3, key
    params_bytes = sum(v.numel() * 4 for v in result.state.params.values())
    assert client.get_metric_history(result.run_id, "sys/bytes_down")[0].value == 6 * params_bytes
    names = {a.path for a in artifact_repository(tracking_uri, result.run_id).list_artifacts()}
    assert {"learning_curve.png", "time_per_round.png", "final.pt", "cohorts.json", "config"} <= names
    assert (tmp_path / "mlruns").exists()  # artifacts beside the SQLite store, not in the cwd
    logged = data.metrics  # where the time went (test_round_timing.py): each phase, each round
    assert len(client.get_metric_history(result.run_id, "sys/time/training_s")) == 3
    assert {"sys/time/wall_s", "sys/worker/1/utilization", "sys/worker_spread_s"} <= set(logged)
    assert not [key for key in logged if "gpu" in key]  # on a CPU: absent, not a zero


def test_resume_equals_uninterrupted(tmp_path):
    whole = run(
        tiny_job(engine={"num_rounds": 4}, algorithm={"name": "scaffold"}), output_dir=tmp_path / "whole"
    )
    first = run(
        tiny_job(engine={"num_rounds": 2}, algorithm={"name": "scaffold"}), output_dir=tmp_path / "first"
    )
    resumed = run(
        tiny_job(engine={"num_rounds": 4}, algorithm={"name": "scaffold"}),
        resume_from=str(first.run_dir / "checkpoints" / "final.pt"),
        output_dir=tmp_path / "second",
    )
    assert [step for step, _ in resumed.history] == [2, 3]
    for k, v in whole.state.params.items():
        assert torch.equal(v, resumed.state.params[k]), k
    assert torch.equal(whole.state.extra.c["1.weight"], resumed.state.extra.c["1.weight"])


def test_resume_from_a_checkpoint_of_another_model_is_refused(tmp_path):
    first = run(tiny_job(engine={"num_rounds": 1}), output_dir=tmp_path / "a")
    with pytest.raises(CheckpointError, match="does not fit"):
        run(
            tiny_job(model={"name": "mlp", "hidden": [8]}),
            resume_from=str(first.run_dir / "checkpoints" / "final.pt"),
            output_dir=tmp_path / "b",
            branch=True,
        )
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run(tiny_job(), resume_from=str(tmp_path / "nope.pt"), output_dir=tmp_path / "c")


def test_a_run_can_start_from_the_weights_of_another(tmp_path):
    """``model.init_from``: round 0 starts from the other run's final global params (unlike a
    resume, the round number and the server state start afresh); the workers load it too."""
    first = run(tiny_job(engine={"num_rounds": 2}), output_dir=tmp_path / "a")
    job = tiny_job(model={"init_from": str(first.run_dir / "checkpoints" / "final.pt")})
    services, state = build(job, MemoryTracker(), None, tmp_path / "b")
    services.backend.shutdown()
    assert services.start_round == 0
    for k, v in first.state.params.items():
        assert torch.equal(state.params[k], v), k
    one_round = tiny_job(model=job.to_dict()["model"], engine={"num_rounds": 1})
    second = run(one_round, output_dir=tmp_path / "c")
    scratch = run(tiny_job(engine={"num_rounds": 1}), output_dir=tmp_path / "d")
    # Measured 0.46 vs 0.20: one round on top of two trained ones beats one from the seeded init.
    assert second.final["eval/clients/accuracy"] > scratch.final["eval/clients/accuracy"] + 0.1


def run_rounds(job, tmp_path, between=None):
    services, state = build(job, MemoryTracker(), None, tmp_path)
    try:
        for round_num in range(job.engine.num_rounds):
            if between is not None and round_num == 1:
                between(services)
            state, _ = services.run_round(state, round_num)
        return state, services.backend
    finally:
        services.backend.shutdown()


def test_scaffold_state_survives_a_worker_restart(tmp_path, ray_local):
    job = tiny_job(algorithm={"name": "scaffold"}, resources={"backend": "ray", "num_workers": 2})
    expected, _ = run_rounds(job, tmp_path / "a")

    def crash_worker(services):
        ray.kill(services.backend.workers[0], no_restart=False)  # Ray restarts it: state is lost in the actor

    restarted, backend = run_rounds(job, tmp_path / "b", between=crash_worker)
    assert backend.dead_workers == 0
    for k, v in expected.params.items():
        assert torch.equal(v, restarted.params[k]), k
    assert torch.equal(expected.extra.c["1.weight"], restarted.extra.c["1.weight"])


def test_a_worker_that_stays_dead_leaves_the_pool(tmp_path, ray_local):
    job = tiny_job(resources={"backend": "ray", "num_workers": 2, "max_worker_restarts": 0})
    expected, _ = run_rounds(job, tmp_path / "a")

    def kill_for_good(services):
        ray.kill(services.backend.workers[1], no_restart=True)

    survived, backend = run_rounds(job, tmp_path / "b", between=kill_for_good)
    assert backend.dead_workers == 1 and len(backend.workers) == 1
    for k, v in expected.params.items():
        assert torch.allclose(v, survived.params[k], rtol=1e-6, atol=1e-7), k


class FailingFedAvg:
    """FedAvg whose clients with an id divisible by 7 raise (a test plugin)."""

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def client_update(self, ctx):
        if ctx.client_id % 7 == 0:
            raise ValueError("boom")
        return self.inner.client_update(ctx)


def test_client_failures_follow_the_policy(tmp_path):
    fedavg_config = registry.get("algorithm", "fedavg").config
    registry.register("algorithm", "failing_fedavg", config=fedavg_config)(FailingFedAvg)
    job = tiny_job(algorithm={"name": "failing_fedavg"}, engine={"num_rounds": 6})
    with pytest.raises(ClientError, match="boom") as info:
        run(job, output_dir=tmp_path / "strict")
    assert info.value.client_id % 7 == 0 and isinstance(info.value.__cause__, ValueError)
    assert "(raised at tests/integration/engine/test_engine.py:" in str(info.value)  # the plugin's line
    tolerant = run(
        tiny_job(algorithm={"name": "failing_fedavg"}, engine={"num_rounds": 6, "max_failed_clients": 6}),
        output_dir=tmp_path / "tolerant",
    )
    failed = [m["sys/failed_clients"] for _, m in tolerant.history]
    assert sum(failed) > 0 and len(failed) == 6


def test_a_model_that_does_not_fit_the_data_is_a_config_error(tmp_path):
    from raysim.config import JobConfig
    from raysim.errors import ConfigError

    raw = tiny_job().to_dict() | {"model": {"name": "cnn_fmnist"}}  # two 5x5 convs on 8x8 digits
    with pytest.raises(ConfigError, match="'cnn_fmnist' cannot be built for dataset 'digits'"):
        run(JobConfig.from_dict(raw), output_dir=tmp_path)


def test_a_fixed_schedule_replays_the_cohorts_of_another_run(tmp_path):
    import json

    first = run(tiny_job(), output_dir=tmp_path / "a")
    schedule = first.run_dir / "cohorts.json"
    recorded = json.loads(schedule.read_text())["cohorts"]
    assert len(recorded) == 3 and all(len(c) == 6 for c in recorded)
    replay = run(
        tiny_job(seed=11, algorithm={"name": "fedprox"}, engine={"schedule": str(schedule)}),
        output_dir=tmp_path / "b",
    )
    assert json.loads((replay.run_dir / "cohorts.json").read_text())["cohorts"] == recorded
    other = run(tiny_job(seed=11), output_dir=tmp_path / "c")
    assert json.loads((other.run_dir / "cohorts.json").read_text())["cohorts"] != recorded


class OneShotAverage:
    """A one-shot plugin: one round on every client, through the engine's services (a test plugin)."""

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def protocol(self, services, state):
        import numpy as np

        everyone = np.arange(services.info.num_clients)
        output = services.train_cohort(self.payload(state, 0, services.info), everyone, 0)
        state, metrics = self.server_update(state, output.aggregate, 0, services.info)
        services.log(metrics | services.evaluate(state) | {"oneshot/clients": float(len(everyone))}, 0)
        return state


def test_a_protocol_override_replaces_the_round_loop(tmp_path):
    fedavg_config = registry.get("algorithm", "fedavg").config
    registry.register("algorithm", "oneshot_test", config=fedavg_config)(OneShotAverage)
    result = run(tiny_job(algorithm={"name": "oneshot_test"}, engine={"num_rounds": 50}), output_dir=tmp_path)
    assert [step for step, _ in result.history] == [0]
    assert result.final["oneshot/clients"] == 20 and "eval/clients/accuracy" in result.final
    assert (result.run_dir / "checkpoints" / "final.pt").exists()


def test_a_branch_copies_client_state_instead_of_sharing_it(tmp_path):
    parent = run(
        tiny_job(engine={"num_rounds": 2}, algorithm={"name": "scaffold"}), output_dir=tmp_path / "p"
    )
    before = sorted(p.name for p in (parent.run_dir / "client_state").rglob("*.pt"))
    branch = run(
        tiny_job(engine={"num_rounds": 4}, algorithm={"name": "scaffold"}),
        resume_from=str(parent.run_dir / "checkpoints" / "final.pt"),
        output_dir=tmp_path / "b",
    )
    assert sorted(p.name for p in (parent.run_dir / "client_state").rglob("*.pt")) == before
    assert len(list((branch.run_dir / "client_state").rglob("*.pt"))) >= len(before)
    import json

    schedule = json.loads((branch.run_dir / "cohorts.json").read_text())
    assert schedule["first_round"] == 2 and len(schedule["cohorts"]) == 2


def test_resume_from_a_mid_run_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """SCAFFOLD keeps client state: the resumed run must see it as of the checkpoint's round."""
    job = tiny_job(
        engine={"num_rounds": 6, "checkpoint_every": 2, "cohort_size": 10}, algorithm={"name": "scaffold"}
    )
    whole = run(job, output_dir=tmp_path / "whole")
    resumed = run(
        job,
        resume_from=str(whole.run_dir / "checkpoints" / "round_00003.pt"),
        output_dir=tmp_path / "resumed",
    )
    assert [step for step, _ in resumed.history] == [4, 5]
    for k, v in whole.state.params.items():
        assert torch.equal(v, resumed.state.params[k]), k


def test_two_workers_dying_in_one_round_leave_one_to_finish(tmp_path, ray_local):
    job = tiny_job(
        resources={"backend": "ray", "num_workers": 3, "cpus_per_worker": 0.5, "max_worker_restarts": 0}
    )
    expected, _ = run_rounds(job, tmp_path / "a")

    def kill_two(services):
        for worker in services.backend.workers[:2]:
            ray.kill(worker, no_restart=True)

    survived, backend = run_rounds(job, tmp_path / "b", between=kill_two)
    assert backend.dead_workers == 2 and len(backend.workers) == 1
    for k, v in expected.params.items():
        assert torch.allclose(v, survived.params[k], rtol=1e-6, atol=1e-7), k


def test_resuming_another_kind_of_algorithm_is_refused(tmp_path):
    first = run(tiny_job(engine={"num_rounds": 1}), output_dir=tmp_path / "a")
    with pytest.raises(CheckpointError, match="another kind of algorithm"):
        run(
            tiny_job(algorithm={"name": "scaffold"}),
            resume_from=str(first.run_dir / "checkpoints" / "final.pt"),
            output_dir=tmp_path / "b",
            branch=True,
        )
    branch = run(
        tiny_job(algorithm={"name": "fedadam"}, engine={"num_rounds": 2}),  # same family
        resume_from=str(first.run_dir / "checkpoints" / "final.pt"),
        output_dir=tmp_path / "c",
        branch=True,
    )
    assert [step for step, _ in branch.history] == [1]


def test_the_final_checkpoint_is_written_even_when_not_uploaded(tmp_path):
    result = run(tiny_job(engine={"num_rounds": 1}, tracking={"log_checkpoint": False}), output_dir=tmp_path)
    assert (result.run_dir / "checkpoints" / "final.pt").exists()


def test_a_probe_that_would_never_run_is_warned_of_once_before_training(tmp_path, capfd):
    probes = [{"name": "client_server_barrier", "every": 9}]
    run(tiny_job(evaluation={"every": 1, "probes": probes}), output_dir=tmp_path)
    err = capfd.readouterr().err
    assert err.count("warning: evaluation.probes[0].every: client_server_barrier measures every 9") == 1
