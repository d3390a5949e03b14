"""A NaN or infinity never reaches the global model: diverging clients are dropped or stop the
run (``engine.max_failed_clients``), and a non-finite aggregate or server step stops the run."""

import math

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim import registry
from raysim.aggregate import Sum
from raysim.engine.loop import run
from raysim.errors import ClientError, NonFiniteError, RaysimError
from raysim.runtime import worker as raysim_worker
from raysim.runtime.client_state import ClientStateStore
from raysim.stop_request import clear_stop_request, note_stop_request
from raysim.tracking.tracker import MemoryTracker
from raysim.types import ClientResult

BACKENDS = ["serial", "ray"]


def diverging_job(backend, failure="diverge", inner="fedavg", **engine):
    """Clients 0, 7 and 14 of 20 go wrong; 4 rounds of 6 clients sample some of them."""
    return tiny_job(
        algorithm={"name": "diverging_test", "inner": inner, "failure": failure},
        engine={"num_rounds": 4, **engine},
        resources={"backend": backend, "num_workers": 2},
    )


def use_backend(request, backend):
    if backend == "ray":
        request.getfixturevalue("ray_local")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_diverging_client_stops_the_run_by_default(tmp_path, request, backend):
    use_backend(request, backend)
    tracker = MemoryTracker()
    with pytest.raises(ClientError, match="during update_check: NonFiniteError") as info:
        run(diverging_job(backend), tracker=tracker, output_dir=tmp_path)
    assert info.value.client_id % 7 == 0 and info.value.stage == "update_check"
    assert isinstance(info.value.__cause__, NonFiniteError)
    assert "1.weight" in str(info.value)  # names the tensors that are not finite
    assert tracker.status == "FAILED"


@pytest.mark.parametrize("backend", BACKENDS)
def test_diverging_clients_are_dropped_and_counted_like_failing_ones(tmp_path, request, backend):
    """Dropping a NaN client must give exactly the run in which that client raised instead,
    client state included (SCAFFOLD keeps none for a dropped client)."""
    use_backend(request, backend)
    diverged = run(
        diverging_job(backend, inner="scaffold", max_failed_clients=6), output_dir=tmp_path / "nan"
    )
    raised = run(
        diverging_job(backend, "raise", inner="scaffold", max_failed_clients=6), output_dir=tmp_path / "raise"
    )
    nonfinite = [m["sys/nonfinite_clients"] for _, m in diverged.history]
    failed = [m["sys/failed_clients"] for _, m in diverged.history]
    assert sum(nonfinite) > 0 and nonfinite == failed
    assert [m["sys/failed_clients"] for _, m in raised.history] == failed
    assert all(m["sys/nonfinite_clients"] == 0 for _, m in raised.history)
    assert P.is_finite(diverged.state.params) and P.is_finite(diverged.state.extra)
    for k, v in raised.state.params.items():
        assert torch.equal(v, diverged.state.params[k]), k
    states = ClientStateStore(diverged.run_dir / "client_state")
    wild = [c for c in range(20) if c % 7 == 0 and states.get(c, before_round=99) is not None]
    assert wild == []  # a dropped client's new state is not kept


class OverflowingSum:
    """Every client sends finite 3e38s; their float32 sum overflows (a test plugin)."""

    Config = registry.get("algorithm", "fedavg").config

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def client_update(self, ctx):
        return ClientResult({k: torch.full_like(v, 3e38) for k, v in ctx.global_params.items()}, 1.0)

    def aggregator(self):
        return Sum()


def test_a_nonfinite_aggregate_stops_the_run_naming_the_round(tmp_path):
    registry.register("algorithm", "overflowing_test")(OverflowingSum)
    tracker = MemoryTracker()
    with pytest.raises(
        NonFiniteError, match=r"round 0: the aggregate .* holds NaN or infinity in \['1.weight'"
    ):
        run(tiny_job(algorithm={"name": "overflowing_test"}), tracker=tracker, output_dir=tmp_path)
    assert tracker.status == "FAILED"


def test_a_nonfinite_server_step_stops_the_run_and_mlflow_says_failed(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    job = tiny_job(
        algorithm={"name": "fedavg", "server": {"lr": 1e39}},  # beyond float32: w - inf * delta
        tracking={"enabled": True, "experiment": "nonfinite"},
    )
    with pytest.raises(NonFiniteError, match="round 0: the new global model holds NaN or infinity"):
        run(job, output_dir=tmp_path)
    client = MlflowClient(tracking_uri)
    [found] = client.search_runs([client.get_experiment_by_name("nonfinite").experiment_id])
    assert found.info.status == "FAILED"
    assert client.get_metric_history(found.info.run_id, "train/loss") == []  # no round was logged


def test_a_round_whose_every_client_failed_stops_the_run_whatever_the_policy_drops(tmp_path):
    """A cohort of 6 that all diverge, under a policy that drops up to 6: nothing is aggregated,
    so the run would go on with the model standing still and end FINISHED."""
    tracker = MemoryTracker()
    job = tiny_job(algorithm={"local": {"lr": 1e30}}, engine={"max_failed_clients": 6})
    with pytest.raises(RaysimError, match="round 0: all 6 clients of the cohort failed, so nothing") as info:
        run(job, tracker=tracker, output_dir=tmp_path)
    assert "the first: client " in str(info.value) and "update_check: NonFiniteError" in str(info.value)
    assert tracker.status == "FAILED"


def test_a_finite_model_whose_outputs_overflow_stops_the_run_at_its_evaluation(tmp_path):
    """FedAvgM's server lr of 1e37 leaves weights near 1e35: finite, so the model check passes,
    but every logit overflows and the loss is NaN (the argmax of NaN logits would still score an
    accuracy)."""
    tracker = MemoryTracker()
    job = tiny_job(algorithm={"name": "fedavgm", "server": {"lr": 1e37}}, engine={"num_rounds": 2})
    with pytest.raises(NonFiniteError, match="round 0: the global model's eval/clients/loss is nan"):
        run(job, tracker=tracker, output_dir=tmp_path)
    assert tracker.status == "FAILED" and not list(tmp_path.rglob("final.pt"))


class NanProtocol:
    """A protocol plugin whose own server step goes NaN (a test plugin)."""

    Config = registry.get("algorithm", "fedavg").config

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def protocol(self, services, state):
        output = services.train_cohort(self.payload(state, 0, services.info), np.arange(4), 0)
        state, metrics = self.server_update(state, output.aggregate, 0, services.info)
        services.log(metrics, 0)
        return type(state)({k: v * math.nan for k, v in state.params.items()})


def test_a_protocol_cannot_finish_with_a_nonfinite_model(tmp_path):
    registry.register("algorithm", "nan_protocol_test")(NanProtocol)
    tracker = MemoryTracker()
    with pytest.raises(NonFiniteError, match="round 0: the final global model"):
        run(tiny_job(algorithm={"name": "nan_protocol_test"}), tracker=tracker, output_dir=tmp_path)
    assert tracker.status == "FAILED" and not list(tmp_path.rglob("final.pt"))  # nothing saved


def test_a_stop_request_wrapped_by_a_clients_code_stops_the_run(tmp_path):
    """SIGTERM's SystemExit landing in a class body (torch builds classes as it imports lazily)
    comes back as a RuntimeError; it must stop the run, not be counted as a failed client."""
    job = diverging_job("serial", failure="stop", max_failed_clients=5)
    with pytest.raises(SystemExit) as stop:
        run(job, tracker=MemoryTracker(), output_dir=tmp_path)
    assert stop.value.code == 143


def test_a_stop_request_whose_exit_was_lost_ends_the_run_at_the_next_client(tmp_path):
    """The handler notes the stop before it exits; an exit lost where it landed (a garbage-
    collection callback ignores it) still ends the run, at the next client."""
    job = diverging_job("serial", failure="lost_stop", max_failed_clients=5)
    try:
        with pytest.raises(SystemExit) as stop:
            run(job, tracker=MemoryTracker(), output_dir=tmp_path)
    finally:
        clear_stop_request()  # this process goes on with other tests
    assert stop.value.code == 143


def test_a_stop_request_whose_exit_was_changed_ends_the_run_with_its_own_code(tmp_path):
    """Where SIGTERM lands in ``ray.get`` or ``ray.wait``, Ray runs the handler, catches its
    SystemExit(143) and raises SystemExit(1): the run still ends KILLED, with exit code 143."""
    job = diverging_job("serial", failure="changed_stop", max_failed_clients=5)
    tracker = MemoryTracker()
    try:
        with pytest.raises(SystemExit) as stop:
            run(job, tracker=tracker, output_dir=tmp_path)
    finally:
        clear_stop_request()
    assert stop.value.code == 143 and tracker.status == "KILLED"


class StopNotedWhileUploading(MemoryTracker):
    """A SIGTERM that lands while the final artifacts upload and whose exit is lost there."""

    def log_artifact(self, path, artifact_dir=None):
        note_stop_request(143)
        super().log_artifact(path, artifact_dir)


def test_a_stop_request_noted_after_the_last_round_ends_the_run_killed(tmp_path):
    """No round's end is left to honour it: the run must not end FINISHED (exit 0) regardless."""
    tracker = StopNotedWhileUploading()
    try:
        with pytest.raises(SystemExit) as stop:
            run(tiny_job(engine={"num_rounds": 1}), tracker=tracker, output_dir=tmp_path)
    finally:
        clear_stop_request()
    assert stop.value.code == 143 and tracker.status == "KILLED"


@pytest.mark.parametrize("inner, retrains", [("fedavg", True), ("scaffold", False)])
def test_deferred_checks_give_the_run_of_checks_at_once(tmp_path, monkeypatch, inner, retrains):
    """On a GPU a worker queues its clients' checks (``device_reads``) and trains a round again
    when one fails; forced here on the CPU, the run must be the one that checks each client at
    once, bit for bit: the same clients dropped, the same model. SCAFFOLD's clients return state,
    kept at once, so each is checked at once and no round is trained again."""
    at_once = run(diverging_job("serial", inner=inner, max_failed_clients=6), output_dir=tmp_path / "a")
    retrained = []
    real = raysim_worker.RoundChecks

    def counting(defer):
        retrained.append(defer)
        return real(defer)

    monkeypatch.setattr(raysim_worker, "defers_reads", lambda device: True)
    monkeypatch.setattr(raysim_worker, "RoundChecks", counting)
    queued = run(diverging_job("serial", inner=inner, max_failed_clients=6), output_dir=tmp_path / "q")
    assert (retrained.count(False) > 0) == retrains  # a round found a diverged client: again
    assert [m["sys/nonfinite_clients"] for _, m in queued.history] == [
        m["sys/nonfinite_clients"] for _, m in at_once.history
    ]
    assert [m["train/loss"] for _, m in queued.history] == [m["train/loss"] for _, m in at_once.history]
    for k, v in at_once.state.params.items():
        assert torch.equal(v, queued.state.params[k]), k
