"""Start-up seconds for ``raysim bench``: each measured in a fresh process, as a user meets it.

``import raysim``, ``raysim --help``, ``raysim ls`` (its listing cached), and for the benchmark's
job: the seconds from launching a one-round run to its first round (the data prepared already;
Python's imports, the store opened, the workers started and answering, the MLflow run begun when
the job tracks, in a store of its own made beforehand) and to the run's end.

Usage:
    figures = startup_seconds(job)       # {"import_s": ..., "first_round_s": ..., ...}
    python -m raysim.bench.startup JOB.yaml OUTPUT_DIR   # the timed run: prints when round 0 began
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.table import Table

if TYPE_CHECKING:
    from raysim.config import JobConfig
    from raysim.tracking.lineage import Lineage
    from raysim.tracking.tracker import Tracker
    from raysim.types import Metrics

COLUMNS = {  # figure -> column of the table
    "import_s": "import raysim",
    "help_s": "raysim --help",
    "ls_s": "raysim ls",
    "first_round_s": "run: to round 0",
    "one_round_run_s": "run: 1 round, all",
}


def startup_seconds(job: JobConfig) -> dict[str, float | None]:
    """Each start-up figure of ``COLUMNS``, in seconds (None: the command failed, and the
    benchmark's other figures stand); ``job`` runs for one round."""
    python = [sys.executable, "-m", "raysim"]
    figures = {
        "import_s": wall_seconds([sys.executable, "-c", "import raysim"]),
        "help_s": wall_seconds([*python, "--help"]),
    }
    subprocess.run([*python, "ls"], capture_output=True)  # fills the listing's cache
    figures["ls_s"] = wall_seconds([*python, "ls"])
    with tempfile.TemporaryDirectory(prefix="raysim-startup-") as folder:
        path = Path(folder) / "job.yaml"
        one_round = job.to_dict() | {"engine": {**job.engine.model_dump(), "num_rounds": 1}}
        if job.tracking.enabled:  # a store of its own, made beforehand as a user's store is
            uri = f"sqlite:///{Path(folder) / 'mlflow.db'}"
            one_round["tracking"] = one_round["tracking"] | {"tracking_uri": uri}
            create_store(uri)
        path.write_text(yaml.safe_dump(one_round, sort_keys=False))
        launched = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "raysim.bench.startup", str(path), folder], capture_output=True, text=True
        )
        ok = done.returncode == 0
        figures["one_round_run_s"] = time.time() - launched if ok else None
        round_0_at = json.loads(done.stdout.splitlines()[-1])["round_0_at"] if ok else None
        figures["first_round_s"] = round_0_at - launched if round_0_at is not None else None
    return figures


def create_store(uri: str) -> None:
    """Makes an MLflow store's schema (its first client does), so the timed run only opens it."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments()


def wall_seconds(command: list[str]) -> float | None:
    """Seconds ``command`` takes, from launch to exit; None when it fails."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True)
    return time.perf_counter() - start if done.returncode == 0 else None


def startup_table(figures: dict[str, Any]) -> Table:
    table = Table(title="start-up: seconds, each in a fresh process")
    for column in COLUMNS.values():
        table.add_column(column, justify="right")
    table.add_row(*("failed" if figures[key] is None else f"{figures[key]:.2f}" for key in COLUMNS))
    return table


class RoundZeroClock:
    """The job's own tracker, noting when the run starts it: once every piece is built and the
    workers answer, just before round 0 (``engine.build.start_run``)."""

    def __init__(self, inner: Tracker) -> None:
        self.inner, self.round_0_at, self.run_id = inner, 0.0, inner.run_id

    def start(self, job: JobConfig, run_dir: Path | None = None, lineage: Lineage | None = None) -> None:
        self.inner.start(job, run_dir, lineage)
        self.round_0_at, self.run_id = time.time(), self.inner.run_id

    def log_metrics(self, metrics: Metrics, step: int) -> None:
        self.inner.log_metrics(metrics, step)

    def log_artifact(self, path: str | Path, artifact_dir: str | None = None) -> None:
        self.inner.log_artifact(path, artifact_dir)

    def finish(self, status: str = "FINISHED") -> None:
        self.inner.finish(status)


def _timed_run(job_path: str, output_dir: str) -> None:
    """Runs the job as ``raysim run`` would and prints when its round 0 began (epoch seconds)."""
    from raysim.config import load_jobs
    from raysim.engine.loop import run
    from raysim.tracking.tracker import MemoryTracker, MlflowTracker

    (job,) = load_jobs(job_path, [])
    clock = RoundZeroClock(MlflowTracker(job.tracking) if job.tracking.enabled else MemoryTracker())
    run(job, tracker=clock, output_dir=output_dir)
    print(json.dumps({"round_0_at": clock.round_0_at}))


if __name__ == "__main__":
    _timed_run(*sys.argv[1:3])
