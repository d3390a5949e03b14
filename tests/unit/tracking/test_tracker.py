"""MLflow tracking: runs started at once in a new directory do not crash each other."""

import multiprocessing
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from raysim.config import JobConfig, TrackingConfig
from raysim.tracking.tracker import MlflowTracker
from raysim.tracking.tracking_store import resolve_artifact_uri

NUM_TRIES = 3

JOB = {
    "name": "race",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def start_trackers(uris: list[str], barrier, results) -> None:
    """One process: for each fresh store, waits for the other process, then starts a run."""
    job = JobConfig.from_dict(JOB)
    for uri in uris:
        barrier.wait(timeout=300)
        try:
            tracker = MlflowTracker(TrackingConfig(tracking_uri=uri, experiment="race"))
            tracker.start(job)
            tracker.finish()
            results.put((uri, "ok"))
        except Exception as exc:  # reported to the test, which names it
            results.put((uri, f"{type(exc).__name__}: {exc}"[:500]))


def test_two_first_runs_started_at_once_both_succeed(tmp_path):
    """Without a lock, 3 of 3 tries crashed one process (a duplicate CREATE or ALTER TABLE)."""
    uris = [f"sqlite:///{tmp_path / f'try{i}' / 'mlflow.db'}" for i in range(NUM_TRIES)]
    context = multiprocessing.get_context("spawn")  # fresh interpreters, like two `raysim run`s
    barrier, results = context.Barrier(2), context.Queue()
    processes = [context.Process(target=start_trackers, args=(uris, barrier, results)) for _ in range(2)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=600) for _ in range(2 * NUM_TRIES)]
    for process in processes:
        process.join(timeout=60)
    assert [outcome for outcome in outcomes if outcome[1] != "ok"] == []
    for uri in uris:
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
        assert len(runs) == 2 and {run.info.status for run in runs} == {"FINISHED"}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory):
    """One SQLite store for the tests below (creating its schema takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def test_an_experiment_created_meanwhile_by_another_run_is_used(store_uri, monkeypatch):
    """A tracking server has no file to lock: the loser of the creation race uses the winner's."""
    tracker = MlflowTracker(TrackingConfig(tracking_uri=store_uri, experiment="shared"))
    existing = tracker.client.create_experiment("shared")  # the other run got there first ...
    found = tracker.client.get_experiment_by_name
    answers = iter([None])  # ... after this run had looked and found nothing
    monkeypatch.setattr(tracker.client, "get_experiment_by_name", lambda name: next(answers, found(name)))
    assert tracker.experiment_id() == existing


def test_other_errors_creating_the_experiment_are_not_swallowed(store_uri, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

    tracker = MlflowTracker(TrackingConfig(tracking_uri=store_uri, experiment="refused"))

    def refuse(*args, **kwargs):
        raise MlflowException("permission denied", error_code=PERMISSION_DENIED)

    monkeypatch.setattr(tracker.client, "create_experiment", refuse)
    with pytest.raises(MlflowException, match="permission denied"):
        tracker.experiment_id()


def test_a_sqlite_store_keeps_artifact_locations_relative_to_its_folder(store_uri, tmp_path):
    tracker = MlflowTracker(TrackingConfig(tracking_uri=store_uri, experiment="relative"))
    experiment_id = tracker.experiment_id()
    assert tracker.client.get_experiment(experiment_id).artifact_location == f"mlruns/{experiment_id}"
    folder = Path(store_uri.removeprefix("sqlite:///")).parent
    assert resolve_artifact_uri(store_uri, "mlruns/1/r/artifacts") == str(folder / "mlruns/1/r/artifacts")
    assert resolve_artifact_uri(store_uri, "/abs/mlruns/1") == "/abs/mlruns/1"  # older stores
    assert resolve_artifact_uri("http://server:5000", "mlruns/1") == "mlruns/1"  # a server resolves its own


def test_raysims_experiments_open_in_the_model_training_view(store_uri):
    """MLflow 3's UI shows an experiment without ``mlflow.experimentKind`` in its GenAI view."""
    tracker = MlflowTracker(TrackingConfig(tracking_uri=store_uri, experiment="training-view"))
    created = tracker.client.get_experiment(tracker.experiment_id())
    assert created.tags["mlflow.experimentKind"] == "custom_model_development"
    older = tracker.client.create_experiment("older")  # made before raysim tagged its experiments
    chosen = tracker.client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    for name, experiment_id in (("older", older), ("chosen", chosen)):
        user = MlflowTracker(TrackingConfig(tracking_uri=store_uri, experiment=name))
        assert user.experiment_id() == experiment_id
    assert tracker.client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    assert tracker.client.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development"


def test_a_full_store_refusing_to_start_the_run_is_one_clear_error(store_uri, monkeypatch):
    """Nothing to keep yet at the start: a ResourceError (one line, exit 2), not a traceback."""
    import sys

    from mlflow.tracking import MlflowClient

    from raysim.errors import ResourceError

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/mlflow_failures.py
    from mlflow_failures import database_full

    def full(*args, **kwargs):
        raise database_full()

    monkeypatch.setattr(MlflowClient, "create_run", full)
    tracker = MlflowTracker(TrackingConfig(tracking_uri=store_uri, experiment="full"))
    with pytest.raises(ResourceError, match=r"cannot start the run \(database or disk is full\): free space"):
        tracker.start(JobConfig.from_dict(JOB))
