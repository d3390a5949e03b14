"""Experiment tracking from the driver only (SQLite does not like concurrent writers).

``MlflowTracker`` logs one MLflow run per simulation (named ``job/variant``, tagged with its
source, ``mlflow.start_run``), or goes on with the run a resumed checkpoint came from;
``MemoryTracker`` keeps everything in memory for tests and for runs with tracking disabled.

A SQLite store keeps its artifacts in ``mlruns/`` beside the database, at locations relative to
the database's folder, so that the folder can be copied or moved: read them with
``artifact_repository`` (or run ``mlflow ui`` from that folder), not through MLflow's client,
which resolves a relative location against the working directory.

What the store cannot take (a server that is down, a full disk) waits in an ``Outbox``
(``raysim.engine.outbox``) while training goes on.

Usage:
    tracker = MlflowTracker(job.tracking)
    tracker.start(job); tracker.log_metrics({"train/loss": 0.3}, step=0); tracker.finish()
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout

from raysim.config import JobConfig, TrackingConfig, flatten
from raysim.engine.lineage import Lineage, ParentRun
from raysim.engine.outbox import (
    ArtifactRecord,
    EndRecord,
    MetricsRecord,
    Outbox,
    ParamsRecord,
    Record,
    outage_as_error,
)
from raysim.engine.provenance import naming_tags, run_name, source_tags
from raysim.errors import ResourceError
from raysim.runtime.sentinel import Sentinel
from raysim.types import Metrics

_STORE_LOCK_TIMEOUT_S = 600
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


class Tracker(Protocol):
    run_id: str | None

    def start(self, job: JobConfig, run_dir: Path | None = None, lineage: Lineage | None = None) -> None: ...

    def log_metrics(self, metrics: Metrics, step: int) -> None: ...

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...


RUN_DIR_TAG = "run_dir"  # where the run's checkpoints are: ``raysim analyze`` finds them by it


ARTIFACTS_DIR = "mlruns"  # a SQLite store's artifacts, beside its database


def run_tags(job: JobConfig, run_dir: Path | None = None, lineage: Lineage | None = None) -> dict[str, str]:
    """The tags raysim sets: job, variant, plugins, run folder, where a resume came from, the
    user's ``tracking.tags`` (MLflow's source tags come from ``provenance.source_tags``)."""
    return {
        **naming_tags(job),
        "algorithm": job.algorithm.name,
        "dataset": job.dataset.name,
        "model": job.model.name,
        **(lineage.tags(job.engine.num_rounds) if lineage is not None else {}),
        **job.tracking.tags,
        **({RUN_DIR_TAG: str(run_dir.absolute())} if run_dir is not None else {}),
    }


class MemoryTracker:
    """Keeps params, metrics and artifact paths in memory."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.params: dict[str, Any] = {}
        self.tags: dict[str, str] = {}
        self.history: list[tuple[int, Metrics]] = []
        self.artifacts: list[Path] = []
        self.status: str | None = None

    def start(self, job: JobConfig, run_dir: Path | None = None, lineage: Lineage | None = None) -> None:
        self.params, self.tags = flatten(job.to_dict()), run_tags(job, run_dir, lineage)

    def log_metrics(self, metrics: Metrics, step: int) -> None:
        self.history.append((step, dict(metrics)))

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None:
        self.artifacts.append(Path(path))

    def finish(self, status: str = "FINISHED") -> None:
        self.status = status


def tracking_uri(config: TrackingConfig) -> str:
    """The job's URI, else MLFLOW_TRACKING_URI, else SQLite in the working directory."""
    return (
        config.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI (query options dropped), None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


def is_server(uri: str) -> bool:
    """A tracking server (runs and artifacts over HTTP), not a database this process opens."""
    return uri.startswith(("http://", "https://"))


def absolute_uri(uri: str, cwd: Path | None = None) -> str:
    """The URI with a relative SQLite path made absolute against ``cwd`` (default: the working
    directory), so that a process started elsewhere (an MLflow server run in the store's folder, a
    Ray job) opens the same database; other URIs as they are."""
    if not uri.startswith("sqlite:///"):
        return uri
    path, _, query = uri.removeprefix("sqlite:///").partition("?")
    database = ((cwd or Path.cwd()) / Path(path).expanduser()).resolve()
    return f"sqlite:///{database}" + (f"?{query}" if query else "")


def artifact_root(uri: str) -> str | None:
    """For a SQLite store, artifacts go beside the database (not into the working directory)."""
    database = sqlite_path(uri)
    return (database.parent / ARTIFACTS_DIR).as_uri() if database is not None else None


def resolve_artifact_uri(uri: str, artifact_uri: str) -> str:
    """A run's artifact location as a reader here can open it: a relative one (what raysim
    writes into a SQLite store) lies in the database's folder."""
    database = sqlite_path(uri)
    if database is None or "://" in artifact_uri or Path(artifact_uri).is_absolute():
        return artifact_uri
    return str(database.parent / artifact_uri)


def artifact_repository(uri: str, run_id: str) -> Any:
    """The MLflow artifact repository of a run in the store at ``uri``, wherever the store's
    folder was copied to: ``.download_artifacts(path, dst)``, ``.list_artifacts()``."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    return get_artifact_repository(resolve_artifact_uri(uri, run.info.artifact_uri), tracking_uri=uri)


def download_artifact(uri: str, run_id: str, artifact_path: str, dst: str | Path) -> Path:
    """Downloads one artifact of a run into ``dst`` (made if missing); returns the local path."""
    Path(dst).mkdir(parents=True, exist_ok=True)
    return Path(artifact_repository(uri, run_id).download_artifacts(artifact_path, str(dst)))


def _make_relative(database: Path, experiment_id: str) -> None:
    """Stores an experiment's artifact location relative to the database's folder.

    MLflow has no API for it: ``create_experiment`` turns every local location absolute, which
    breaks a store copied or moved to another folder. Its runs then get relative locations too
    (MLflow appends the run id to the experiment's).
    """
    with contextlib.closing(sqlite3.connect(database)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
            (f"{ARTIFACTS_DIR}/{experiment_id}", int(experiment_id)),
        )


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Holds an inter-process lock on a SQLite store (no-op for other stores).

    MLflow creates the SQLite schema and the default experiment when a client first opens the
    database, without any locking: two runs started at once in a new directory collide on
    ``CREATE TABLE`` / ``ALTER TABLE`` and one of them crashes. The lock file sits beside the
    database; the OS releases it when its holder dies.

    Raises:
        ResourceError: another process held the lock for longer than 10 minutes.
    """
    database = sqlite_path(uri)
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(database.with_name(database.name + ".lock"))
    try:
        lock.acquire(timeout=_STORE_LOCK_TIMEOUT_S)
    except Timeout:
        raise ResourceError(
            f"the MLflow store {database} stayed locked ({lock.lock_file}) for "
            f"{_STORE_LOCK_TIMEOUT_S} s by another process; is one stuck?"
        ) from None
    try:
        yield
    finally:
        lock.release()


class MlflowTracker:
    """One MLflow run per simulation: flattened config as params, tags, metrics, artifacts.

    Runs start and end through MLflow's fluent API (``mlflow.start_run`` fills in the user and
    source tags); metrics and artifacts go to the run by id, so nothing depends on which run is
    "active" in between.
    """

    def __init__(self, config: TrackingConfig) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(config)
        with store_lock(self.uri):  # the first client of a new SQLite store creates its schema
            self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment = config.experiment
        self.run_id: str | None = None
        self._started = False  # by this tracker (attach never starts nor ends a run)
        self._artifacts: Any = None
        self.sentinel: Sentinel | None = None  # ends the run as KILLED if this process dies
        self.outbox: Outbox | None = None  # a run this tracker started: records wait if the store is away
        self.run_dir: Path | None = None

    def experiment_id(self) -> str:
        """The experiment's id; created when missing, by whichever process gets there first, and
        tagged to open in the MLflow UI's model-training view (MLflow 3: else its GenAI view)."""
        from mlflow.exceptions import MlflowException

        with store_lock(self.uri):
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                if EXPERIMENT_KIND not in found.tags:  # a kind someone chose in the UI stays
                    self.client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
                return found.experiment_id
            try:
                created = self.client.create_experiment(
                    self.experiment, artifact_root(self.uri), tags={EXPERIMENT_KIND: MODEL_TRAINING}
                )
            except MlflowException as exc:  # a tracking server: another run created it meanwhile
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            else:
                database = sqlite_path(self.uri)
                if database is not None:
                    _make_relative(database, created)
                return created
            existing = self.client.get_experiment_by_name(self.experiment)
            if existing is None:  # created and deleted again in between: let MLflow say why
                raise RuntimeError(f"MLflow experiment {self.experiment!r} could not be created")
            return existing.experiment_id

    def parent_run(self, run_id: str) -> ParentRun | None:
        """A run of this store (None: not here, or deleted), with the last step it logged."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return None
        if run.info.lifecycle_stage != "active":
            return None
        steps = [
            metric.step for key in run.data.metrics for metric in self.client.get_metric_history(run_id, key)
        ]
        running = run.info.status == "RUNNING" and run.info.end_time is None
        return ParentRun(run_id, run.info.experiment_id, max(steps, default=None), running)

    def start(self, job: JobConfig, run_dir: Path | None = None, lineage: Lineage | None = None) -> None:
        """Starts the job's run, or, for a ``lineage`` that continues, goes on with its parent.

        A continued run keeps its params (MLflow never changes them): its current
        ``engine.num_rounds`` is the ``num_rounds`` tag, its config the ``config/job.yaml``
        artifact, rewritten.
        """
        import mlflow

        mlflow.set_tracking_uri(self.uri)  # the fluent API's store, for start_run and end_run
        tags = {**source_tags(job), **run_tags(job, run_dir, lineage)}
        with outage_as_error(self.uri, "start the run"):  # nothing to keep yet: one clear line
            experiment_id = self.experiment_id()
            if lineage is not None and lineage.continues:
                run = mlflow.start_run(run_id=lineage.parent_run_id, tags=tags)  # back to RUNNING
            else:
                parent = lineage.parent_run_id if lineage is not None and lineage.parent_in_store else None
                run = mlflow.start_run(
                    experiment_id=experiment_id, run_name=run_name(job), tags=tags, parent_run_id=parent
                )
        self.run_id, self._started, self.run_dir = run.info.run_id, True, run_dir
        self.outbox = Outbox(self.deliver, self.uri)
        self.sentinel = Sentinel.start("end-run", self.uri, self.run_id)  # KILLED if this process dies
        try:
            if lineage is None or not lineage.continues:
                self._log_params(job)
            self._log_config(job)
        except BaseException:
            self.finish("FAILED")
            raise

    def _log_params(self, job: JobConfig) -> None:
        params = [(k, str(v)) for k, v in flatten(job.to_dict()).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._send(ParamsRecord(dict(params[start : start + 100])))

    @classmethod
    def attach(cls, run_id: str, uri: str) -> MlflowTracker:
        """A tracker that logs into an existing run (``raysim analyze`` adds its results to the
        run it analyzes) and never starts or ends one."""
        tracker = cls(TrackingConfig(tracking_uri=uri))
        tracker.run_id = run_id
        return tracker

    def log_metrics(self, metrics: Metrics, step: int) -> None:
        self._send(MetricsRecord.now(metrics, step))

    def _send(self, record: Record) -> None:
        """Through the outbox of a run this tracker started, else straight to the store."""
        (self.outbox.send if self.outbox is not None else self.deliver)(record)

    def deliver(self, record: Record) -> None:
        """Sends one record to the run now (raises what the store raises)."""
        from mlflow.entities import Metric, Param

        assert self.run_id is not None, "logging before start"
        if isinstance(record, MetricsRecord):
            metrics = [Metric(k, v, record.timestamp, record.step) for k, v in record.metrics.items()]
            self.client.log_batch(self.run_id, metrics=metrics)
        elif isinstance(record, ParamsRecord):
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in record.params.items()])
        elif isinstance(record, ArtifactRecord):
            self.artifacts().log_artifact(record.path, record.artifact_dir)
        else:
            self._end(record.status)

    def artifacts(self) -> Any:
        """The run's artifact repository (relative locations resolved against the store)."""
        assert self.run_id is not None, "artifacts before start"
        if self._artifacts is None:
            self._artifacts = artifact_repository(self.uri, self.run_id)
        return self._artifacts

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None:
        self._send(ArtifactRecord(str(Path(path).absolute()), artifact_dir))

    def _log_config(self, job: JobConfig) -> None:
        """The resolved job as the ``config/job.yaml`` artifact (``raysim analyze`` reads it), kept
        in the run folder as ``config/job.yaml`` (an artifact that waits for the store needs its file)."""
        import tempfile

        import yaml

        with contextlib.ExitStack() as scratch:
            folder = self.run_dir or Path(scratch.enter_context(tempfile.TemporaryDirectory()))
            local = folder / "config" / "job.yaml"
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(yaml.safe_dump(job.to_dict(), sort_keys=False))
            self.log_artifact(local, "config")

    def finish(self, status: str = "FINISHED") -> None:
        """Ends the run this tracker started (``mlflow.end_run``), after whatever waits for the store;
        an attached one stays as it is. A store still away keeps the run RUNNING: what it did not
        take is saved in the run folder (``Outbox.save``), its end included.

        Raises:
            ResourceError: the store is away and the tracker has no run folder to save into.
        """
        if not self._started or self.run_id is None:
            return
        self._started = False
        assert self.outbox is not None
        if not self.outbox.close(EndRecord(status)):
            if self.run_dir is None:
                raise ResourceError(f"the MLflow store {self.uri} is away ({self.outbox.reason}); "
                                    f"the run's last records were not logged")  # fmt: skip
            self.outbox.save(self.run_dir, self.run_id)
        if self.sentinel is not None:  # not when the end failed otherwise: then the sentinel ends it
            self.sentinel.stand_down()
            self.sentinel = None

    def _end(self, status: str) -> None:
        import mlflow

        assert self.run_id is not None
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status)
        else:  # another run became active in this thread meanwhile: end ours by id
            self.client.set_terminated(self.run_id, status)
