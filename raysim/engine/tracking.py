"""Experiment tracking from the driver only (SQLite does not like concurrent writers).

``MlflowTracker`` logs one MLflow run per simulation; ``MemoryTracker`` keeps everything in
memory for tests and for runs with tracking disabled.

Usage:
    tracker = MlflowTracker(job.tracking)
    tracker.start(job); tracker.log_metrics({"train/loss": 0.3}, step=0); tracker.finish()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from raysim.config import JobConfig, TrackingConfig, flatten
from raysim.types import Metrics


class Tracker(Protocol):
    run_id: str | None

    def start(self, job: JobConfig) -> None: ...

    def log_metrics(self, metrics: Metrics, step: int) -> None: ...

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...


def run_tags(job: JobConfig) -> dict[str, str]:
    return {
        "algorithm": job.algorithm.name,
        "dataset": job.dataset.name,
        "model": job.model.name,
        "job": job.name,
        **job.tracking.tags,
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

    def start(self, job: JobConfig) -> None:
        self.params, self.tags = flatten(job.to_dict()), run_tags(job)

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


def artifact_root(uri: str) -> str | None:
    """For a SQLite store, artifacts go beside the database (not into the working directory)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()
    return None


class MlflowTracker:
    """One MLflow run per simulation: flattened config as params, tags, metrics, artifacts."""

    def __init__(self, config: TrackingConfig) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(config)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment = config.experiment
        self.run_id: str | None = None

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        return self.client.create_experiment(self.experiment, artifact_location=artifact_root(self.uri))

    def start(self, job: JobConfig) -> None:
        from mlflow.entities import Param

        run = self.client.create_run(
            self._experiment_id(), run_name=job.tracking.run_name or job.name, tags=run_tags(job)
        )
        self.run_id = run.info.run_id
        params = [Param(k, str(v)) for k, v in flatten(job.to_dict()).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.client.log_dict(self.run_id, job.to_dict(), "config/job.yaml")

    def log_metrics(self, metrics: Metrics, step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        assert self.run_id is not None, "log_metrics before start"
        self.client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_dir)

    def finish(self, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)
