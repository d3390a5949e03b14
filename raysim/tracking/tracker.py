"""Experiment tracking from the driver only (SQLite does not like concurrent writers).

``MlflowTracker`` logs one MLflow run per simulation (named ``job/variant``, tagged with its
source, ``mlflow.start_run``), or goes on with the run a resumed checkpoint came from;
``MemoryTracker`` keeps everything in memory for tests and for runs with tracking disabled.

A SQLite store keeps its artifacts in ``mlruns/`` beside the database, at locations relative to
the database's folder, so that the folder can be copied or moved: read them with
``artifact_repository`` (or run ``mlflow ui`` from that folder), not through MLflow's client,
which resolves a relative location against the working directory.

What the store cannot take (a server that is down, a full disk) waits in an ``Outbox``
(``raysim.tracking.outbox``) while training goes on. Every call to a tracking server is bounded in
time, and only raysim ends its runs: MLflow's exit hook is taken off (``raysim.tracking.store_calls``).

Usage:
    tracker = MlflowTracker(job.tracking)
    tracker.start(job); tracker.log_metrics({"train/loss": 0.3}, step=0); tracker.finish()
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from raysim.config import JobConfig, TrackingConfig, flatten
from raysim.errors import ResourceError
from raysim.runtime.sentinel import Sentinel
from raysim.tracking.lineage import Lineage, ParentRun
from raysim.tracking.outbox import (
    ArtifactRecord,
    EndRecord,
    MetricsRecord,
    Outbox,
    ParamsRecord,
    Record,
    outage_as_error,
)
from raysim.tracking.provenance import naming_tags, run_name, source_tags
from raysim.tracking.store_calls import bound_store_calls, forget_active_run, unhook_mlflow_exit
from raysim.tracking.tracking_store import (
    artifact_repository,
    artifact_root,
    make_relative,
    sqlite_path,
    store_lock,
    tracking_uri,
)
from raysim.types import Metrics

EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


class Tracker(Protocol):
    run_id: str | None

    def start(self, job: JobConfig, run_dir: Path | None = None, lineage: Lineage | None = None) -> None: ...

    def log_metrics(self, metrics: Metrics, step: int) -> None: ...

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...


RUN_DIR_TAG = "run_dir"  # where the run's checkpoints are: ``raysim analyze`` finds them by it


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


class MlflowTracker:
    """One MLflow run per simulation: flattened config as params, tags, metrics, artifacts.

    Runs start and end through MLflow's fluent API (``mlflow.start_run`` fills in the user and
    source tags); metrics and artifacts go to the run by id, so nothing depends on which run is
    "active" in between.
    """

    def __init__(
        self, config: TrackingConfig, parent_run_id: str | None = None, tags: dict[str, str] | None = None
    ) -> None:
        from mlflow.tracking import MlflowClient

        bound_store_calls()
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
        self.parent_run_id = parent_run_id  # a sweep cell's run is the child of the sweep's run,
        self.tags = dict(tags or {})  # tagged with its axes (raysim.config.sweep)

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
                    make_relative(database, created)
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

        unhook_mlflow_exit()  # MLflow's would end the run FINISHED at exit, whatever happened
        mlflow.set_tracking_uri(self.uri)  # the fluent API's store, for start_run and end_run
        tags = {**source_tags(job), **run_tags(job, run_dir, lineage), **self.tags}
        with outage_as_error(self.uri, "start the run"):  # nothing to keep yet: one clear line
            experiment_id = self.experiment_id()
            if lineage is not None and lineage.continues:
                run = mlflow.start_run(run_id=lineage.parent_run_id, tags=tags)  # back to RUNNING
            else:
                parent = lineage.parent_run_id if lineage and lineage.parent_in_store else self.parent_run_id
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
        try:
            is_closed = self.outbox.close(EndRecord(status))
        finally:  # ended, or left RUNNING for `raysim track upload` (or the sentinel) to end
            forget_active_run(self.run_id)
        if not is_closed:
            if self.run_dir is None:
                raise ResourceError(
                    f"the MLflow store {self.uri} is away ({self.outbox.reason}); "
                    f"the run's last records were not logged"
                )
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
