"""A tracking store that goes away mid-run (a server killed, a full disk) costs the run nothing
but its late records: training goes on, the checkpoint is written, what the store did not take is
saved in the run folder, ``raysim run`` exits 3 with one line naming ``raysim track upload``, and
that command completes the same MLflow run, once."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
from mlflow.tracking import MlflowClient

from raysim.cli.main import main
from raysim.engine.engine import Engine
from raysim.tracking.outbox import UNSENT_EXIT_CODE, UNSENT_FILE, UPLOADED_FILE
from raysim.tracking.tracking_store import artifact_repository

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS))  # tests/mlflow_failures.py
from mlflow_failures import artifacts_full, database_full, server_gone  # noqa: E402

NUM_ROUNDS = 3
JOB = {
    "name": "tiny",
    "seed": 1,
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 8}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 32, "lr": 0.1}},
    "engine": {"num_rounds": NUM_ROUNDS, "cohort_size": 3},
    "evaluation": {"every": 1},
    "resources": {"backend": "serial"},
}


def break_after_round(monkeypatch, round_num, breaks) -> None:
    """Runs ``breaks()`` once round ``round_num`` is logged: the store goes away right there."""
    log = Engine.log

    def log_then_break(self, metrics, logged_round):
        log(self, metrics, logged_round)
        if logged_round == round_num:
            breaks()

    monkeypatch.setattr(Engine, "log", log_then_break)


def refusing(failure, calls):
    """Patches for ``MlflowClient`` methods that raise ``failure`` once ``calls["broken"]``."""

    def patch(method):
        def call(self, *args, **kwargs):
            if calls["broken"]:
                raise failure
            return method(self, *args, **kwargs)

        return call

    return patch


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """One SQLite store for the tests here (creating its schema takes seconds); an experiment each."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture
def tracking_uri(shared_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared_store)
    return shared_store


def run_job(tmp_path, capsys):
    job = tmp_path / "tiny.yaml"
    job.write_text(yaml.safe_dump({**JOB, "tracking": {"experiment": tmp_path.name, "progress": False}}))
    code = main(["run", str(job), "--output-dir", str(tmp_path / "out")])
    [folder] = (tmp_path / "out" / "runs").iterdir()
    return code, folder, capsys.readouterr()


def the_run(client, tmp_path):
    [run] = client.search_runs([client.get_experiment_by_name(tmp_path.name).experiment_id])
    return run


def steps(client, run_id):
    return [m.step for m in client.get_metric_history(run_id, "train/loss")]


def outage_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("tracking:")]


@pytest.mark.parametrize(
    ("failure", "methods", "sent_before_upload"),
    [
        (server_gone(), ["log_batch", "set_terminated"], [0, 1]),  # a server gone for good
        (database_full(), ["log_batch", "set_terminated"], [0, 1]),  # SQLite on a full disk
        (artifacts_full(), [], [0, 1, 2]),  # artifacts on a full disk: metrics went, artifacts wait
    ],
    ids=["server-gone", "database-full", "artifacts-full"],
)
def test_a_store_that_fails_mid_run_keeps_the_checkpoint_and_uploads_later(
    failure, methods, sent_before_upload, tmp_path, tracking_uri, monkeypatch, capsys, caplog
):
    calls = {"broken": False}
    patch = refusing(failure, calls)
    for name in methods:
        monkeypatch.setattr(MlflowClient, name, patch(getattr(MlflowClient, name)))
    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", patch(LocalArtifactRepository.log_artifact))
    break_after_round(monkeypatch, 1, lambda: calls.update(broken=True))
    code, folder, out = run_job(tmp_path, capsys)

    assert code == UNSENT_EXIT_CODE  # not 0: not everything was logged; not 1: the model is good
    assert (folder / "checkpoints" / "final.pt").is_file()
    assert "Traceback" not in out.err + out.out
    away, still = outage_lines(caplog)  # one line as it went away, one at the end; nothing between
    assert "cannot take records" in away
    assert f"send them with: raysim track upload {folder}" in still
    client = MlflowClient(tracking_uri)
    run = the_run(client, tmp_path)
    assert run.info.status == "RUNNING" and steps(client, run.info.run_id) == sent_before_upload

    calls["broken"] = False  # the store is back
    assert main(["track", "upload", str(folder)]) == 0
    assert main(["track", "upload", str(folder)]) == 0  # twice: nothing sent twice
    run = the_run(client, tmp_path)
    assert run.info.status == "FINISHED" and (folder / UPLOADED_FILE).is_file()
    assert steps(client, run.info.run_id) == list(range(NUM_ROUNDS))
    artifacts = {a.path for a in artifact_repository(tracking_uri, run.info.run_id).list_artifacts()}
    assert {"final.pt", "learning_curve.png", "cohorts.json", "config"} <= artifacts


def test_a_store_that_comes_back_gets_everything_in_order_and_the_run_exits_0(
    tmp_path, tracking_uri, monkeypatch, capsys, caplog
):
    calls = {"broken": False}
    patch = refusing(server_gone(), calls)
    monkeypatch.setattr(MlflowClient, "log_batch", patch(MlflowClient.log_batch))
    break_after_round(monkeypatch, 0, lambda: calls.update(broken=True))
    # back before the end: the run's last flush sends what waited
    monkeypatch.setattr(Engine, "checkpoint", back_then(Engine.checkpoint, calls))
    code, folder, _ = run_job(tmp_path, capsys)
    assert code == 0 and not (folder / UNSENT_FILE).exists()
    away, back = outage_lines(caplog)
    assert "cannot take records" in away and "is back" in back
    client = MlflowClient(tracking_uri)
    run = the_run(client, tmp_path)
    assert run.info.status == "FINISHED" and steps(client, run.info.run_id) == list(range(NUM_ROUNDS))


def back_then(checkpoint, calls):
    def call(self, *args, **kwargs):
        calls["broken"] = False
        return checkpoint(self, *args, **kwargs)

    return call


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(store_uri: str, port: int, log: Path) -> subprocess.Popen:
    """``raysim server`` as a user starts it, once it answers; its output goes to ``log`` (a pipe
    nobody reads once it has started would fill and block the server)."""
    command = [sys.executable, "-m", "raysim.cli.main", "server", "--port", str(port),
               "--backend-store-uri", store_uri]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180  # two busy cores: an MLflow server start takes 10-20 s
    while "answered after" not in log.read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            if server.poll() is None:
                stop_server(server)
            pytest.fail(f"raysim server did not start (exit {server.poll()}):\n{log.read_text()}")
        time.sleep(0.2)
    return server


def stop_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)  # raysim server stops its MLflow server with it
    server.wait(timeout=60)


@pytest.mark.slow  # two MLflow server starts: 25-40 s on two busy cores
def test_a_tracking_server_killed_after_round_1(tmp_path, monkeypatch, capsys, caplog):
    store_uri, port = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}", free_port()
    (tmp_path / "store").mkdir()
    server = start_server(store_uri, port, tmp_path / "server-1.log")
    stopped_at = []

    def kill() -> None:
        stop_server(server)
        stopped_at.append(time.monotonic())

    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        break_after_round(monkeypatch, 1, kill)
        code, folder, out = run_job(tmp_path, capsys)
    finally:
        if server.poll() is None:
            stop_server(server)
    # the run hung for 499 s in MLflow's own retries; the outage's bounded backoff ends it
    assert time.monotonic() - stopped_at[0] < 90
    assert code == UNSENT_EXIT_CODE and (folder / "checkpoints" / "final.pt").is_file()
    assert "Traceback" not in out.err + out.out
    assert len(outage_lines(caplog)) == 2 and (folder / UNSENT_FILE).is_file()

    server = start_server(store_uri, port, tmp_path / "server-2.log")  # the same store, back
    try:
        assert main(["track", "upload", str(folder)]) == 0
        assert main(["track", "upload", str(folder)]) == 0
        client = MlflowClient(f"http://127.0.0.1:{port}")
        run = the_run(client, tmp_path)
        assert run.info.status == "FINISHED" and steps(client, run.info.run_id) == list(range(NUM_ROUNDS))
        assert "final.pt" in {a.path for a in client.list_artifacts(run.info.run_id)}
    finally:
        stop_server(server)
