"""A sweep run: one parent MLflow run, and each cell not finished yet as a concurrent Ray task
whose own run is that run's child (the tags: ``raysim.config.sweep``).

A rerun of the same sweep (the same id) goes on under the same parent run and skips the cells
whose run FINISHED (or was stopped by the median rule); failed and interrupted cells run again,
each in a new run beside its old one. Without tracking, the driver notes each cell's outcome in a
ledger file (``<output_dir>/sweeps/<sweep id>.jsonl``) and a rerun skips the ones noted finished.

Usage:
    outcomes = run_sweep(load_sweep("jobs/sweeps/mnist_laptop.yaml"), ".raysim", print)
"""

from __future__ import annotations

import json
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from raysim.config import JobConfig, JobOrigin, flatten, validate_job
from raysim.config.cells import Sweep
from raysim.config.sweep import CELL_TAG, ERROR_TAG, KIND_TAG, STOPPED_TAG, SWEEP_KIND, SWEEP_TAG
from raysim.engine.loop import run
from raysim.errors import RaysimError
from raysim.stop_request import clear_stop_request, note_stop_request
from raysim.sweep.ray_cells import CellTask, Reporter, run_cell_tasks
from raysim.tracking.provenance import source_tags
from raysim.tracking.tracker import MemoryTracker, MlflowTracker, Tracker
from raysim.types import Metrics

Status = Literal["FINISHED", "FAILED", "KILLED", "STOPPED"]
SHOWN_METRICS = ("eval/central/accuracy", "eval/clients/accuracy")  # a cell's progress line, when logged
STOPPED_EXIT_CODE = 0  # the SystemExit that ends a cell the median rule stopped


@dataclass(frozen=True)
class CellOutcome:
    """How one cell ended: its run, its last value of each metric, its error if it failed."""

    cell: str
    status: Status
    run_id: str | None = None
    final: Metrics = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""  # one line: the exception's type and message
    details: str = ""  # the traceback of an error that is not raysim's own


class CellTracker(MlflowTracker):
    """A cell's MLflow run, a child of the sweep's run, that reports the stopping metric and asks
    the run to stop (at the round's end) when the median rule says so."""

    def __init__(
        self,
        job: JobConfig,
        parent_run_id: str | None,
        tags: dict[str, str],
        metric: str | None,
        report: Reporter | None,
    ) -> None:
        super().__init__(job.tracking, parent_run_id, tags)
        self.metric, self.report, self.stopped = metric, report, False

    def log_metrics(self, metrics: Metrics, step: int) -> None:
        super().log_metrics(metrics, step)
        value = metrics.get(self.metric) if self.metric is not None else None
        if self.report is not None and value is not None and step >= 0 and self.report(step, float(value)):
            self.stopped = True
            note_stop_request(STOPPED_EXIT_CODE)  # honoured at this round's end: the run ends KILLED


def run_cell(
    job_dict: dict[str, Any],
    origin: JobOrigin | None,
    tags: dict[str, str],
    parent_run_id: str | None,
    output_dir: str,
    metric: str | None,
    report: Reporter | None,
    rule: str = "median",
) -> CellOutcome:
    """Runs one cell (in its Ray task) with the serial backend; its failure is its outcome. The job
    comes as its mapping (``JobConfig.to_dict``), re-validated here: plugins load in this process."""
    clear_stop_request()  # the median rule's stop of the cell this process ran before
    job = validate_job(job_dict)
    job = job.model_copy(
        update={
            "origin": origin,
            "resources": job.resources.model_copy(update={"backend": "serial"}),
            "tracking": job.tracking.model_copy(update={"progress": False}),
        }
    )
    tracker: Tracker = (
        CellTracker(job, parent_run_id, tags, metric, report) if job.tracking.enabled else MemoryTracker()
    )
    start = time.perf_counter()
    try:
        result = run(job, tracker=tracker, output_dir=output_dir)
        return CellOutcome(job.name, "FINISHED", tracker.run_id, result.final, result.seconds)
    except SystemExit:
        if not getattr(tracker, "stopped", False):
            raise
        assert isinstance(tracker, CellTracker) and tracker.run_id is not None
        tracker.client.set_tag(tracker.run_id, STOPPED_TAG, rule)
        return CellOutcome(job.name, "STOPPED", tracker.run_id, seconds=time.perf_counter() - start)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        run_id = tracker.run_id
        if isinstance(tracker, MlflowTracker):  # a cell that failed before its run began gets one
            run_id = run_id or failed_run(tracker, job, tags, parent_run_id)
            tracker.client.set_tag(run_id, ERROR_TAG, error[:5000])
        details = "" if isinstance(exc, RaysimError) else traceback.format_exc()
        seconds = time.perf_counter() - start
        return CellOutcome(job.name, "FAILED", run_id, seconds=seconds, error=error, details=details)


def failed_run(tracker: MlflowTracker, job: JobConfig, tags: dict[str, str], parent: str | None) -> str:
    """A FAILED child run for a cell that failed before its run started, so that every cell shows."""
    parent_tag = {"mlflow.parentRunId": parent} if parent is not None else {}
    run = tracker.client.create_run(
        tracker.experiment_id(), run_name=job.tracking.run_name, tags={**tags, **parent_tag}
    )
    tracker.client.set_terminated(run.info.run_id, "FAILED")
    return str(run.info.run_id)


@dataclass
class SweepRun:
    """The sweep's parent MLflow run."""

    tracker: MlflowTracker
    run_id: str

    @classmethod
    def open(cls, sweep: Sweep, job: JobConfig) -> SweepRun:
        """The sweep's run: the one an earlier try of the same sweep started (RUNNING again), else new."""
        tracker = MlflowTracker(job.tracking)
        experiment = tracker.experiment_id()
        earlier = tracker.client.search_runs(
            [experiment], f"tags.`{SWEEP_TAG}` = '{sweep.id}' and tags.`{KIND_TAG}` = '{SWEEP_KIND}'"
        )
        if earlier:
            run_id = earlier[0].info.run_id
            tracker.client.update_run(run_id, status="RUNNING")
            return cls(tracker, run_id)
        tags = {KIND_TAG: SWEEP_KIND, SWEEP_TAG: sweep.id, "job": sweep.job, **source_tags(job)}
        run = tracker.client.create_run(experiment, run_name=f"{sweep.job}/sweep", tags=tags)
        spec = {f"sweep.{k}": str(v) for k, v in flatten(sweep.spec.model_dump(mode="json")).items()}
        tracker.client.log_batch(run.info.run_id, params=[_param(k, v) for k, v in spec.items()][:100])
        return cls(tracker, run.info.run_id)

    def finished_cells(self, sweep: Sweep) -> set[str]:
        """Cells of this sweep whose run FINISHED or was stopped by the median rule."""
        runs = self.tracker.client.search_runs(
            [self.tracker.experiment_id()], f"tags.`{SWEEP_TAG}` = '{sweep.id}'", max_results=50000
        )
        return {
            r.data.tags[CELL_TAG]
            for r in runs
            if CELL_TAG in r.data.tags and (r.info.status == "FINISHED" or STOPPED_TAG in r.data.tags)
        }

    def end(self, status: str) -> None:
        self.tracker.client.set_terminated(self.run_id, status)

    def kill_running_cells(self, sweep: Sweep) -> None:
        """Ends KILLED the cell runs still RUNNING once the sweep stopped: a SIGTERM reaches the
        driver only, and its cells' workers may be ended before their own clean-up ran."""
        runs = self.tracker.client.search_runs(
            [self.tracker.experiment_id()],
            f"tags.`{SWEEP_TAG}` = '{sweep.id}' and attributes.status = 'RUNNING'",
            max_results=50000,
        )
        for cell_run in runs:
            if cell_run.info.run_id != self.run_id:
                self.tracker.client.set_terminated(cell_run.info.run_id, "KILLED")


@dataclass(frozen=True)
class CellLedger:
    """An untracked sweep's record of its cells' outcomes, one JSON line per cell run (the cell,
    its status, final metrics, seconds and error), so that a rerun skips the finished ones."""

    path: Path

    @classmethod
    def of(cls, sweep: Sweep, output_dir: str | Path) -> CellLedger:
        return cls(Path(output_dir) / "sweeps" / f"{sweep.id}.jsonl")

    def finished_cells(self) -> set[str]:
        """Cells noted FINISHED or STOPPED (by the median rule) on an earlier run."""
        if not self.path.exists():
            return set()
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return {line["cell"] for line in lines if line["status"] in ("FINISHED", "STOPPED")}

    def note(self, outcome: CellOutcome) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as ledger:
            ledger.write(json.dumps(asdict(outcome), default=str) + "\n")


def _param(key: str, value: str) -> Any:
    from mlflow.entities import Param

    return Param(key, value[:6000])


def _shipped(job: JobConfig) -> tuple[dict[str, Any], JobOrigin | None]:
    return job.to_dict(), job.origin


def cell_resources(job: JobConfig) -> tuple[float, float]:
    """A cell's share of the cluster: one worker's CPUs and GPU fraction. The serial backend trains
    the cell's virtual workers one after another in one process with that many torch threads.
    ``gpus_per_worker: auto`` is the whole card there, as on the serial backend."""
    gpus = job.resources.gpus_per_worker
    return job.resources.cpus_per_worker, 1.0 if gpus == "auto" else gpus


def run_sweep(sweep: Sweep, output_dir: str | Path, say: Callable[[str], None]) -> dict[str, CellOutcome]:
    """Runs the sweep's cells not finished before, concurrently; ``say`` gets a line per cell as it
    ends. Returns the outcome of each cell run now (a finished one from before is not in it)."""
    first = sweep.jobs[sweep.cells[0].name]
    refuse_mixed_tracking(sweep)
    parent = SweepRun.open(sweep, first) if first.tracking.enabled else None
    ledger = CellLedger.of(sweep, output_dir)  # used only without tracking
    done = parent.finished_cells(sweep) if parent is not None else ledger.finished_cells()
    todo = [cell for cell in sweep.cells if cell.name not in done]
    where = f"MLflow run {parent.run_id}" if parent is not None else f"untracked: outcomes in {ledger.path}"
    say(
        f"sweep {sweep.id}: {len(sweep.cells)} cells, {len(sweep.cells) - len(todo)} finished before, "
        f"{len(todo)} to run ({where})"
    )
    stopping = sweep.spec.stopping
    parent_id = parent.run_id if parent is not None else None
    metric = stopping.metric if stopping is not None else None
    tasks = [
        CellTask(
            cell.name,
            partial(
                run_cell,
                *_shipped(sweep.jobs[cell.name]),
                cell.tags(sweep.id),
                parent_id,
                str(output_dir),
                metric,
                rule=stopping.rule if stopping is not None else "median",
            ),
            *cell_resources(sweep.jobs[cell.name]),
        )
        for cell in todo
    ]
    outcomes: dict[str, CellOutcome] = {}

    def on_done(name: str, result: Any) -> None:
        outcome = (
            result
            if isinstance(result, CellOutcome)
            else CellOutcome(
                name,
                "KILLED" if isinstance(result, KeyboardInterrupt) else "FAILED",
                error=f"{type(result).__name__}: {result}",
            )
        )
        outcomes[name] = outcome
        if parent is None:
            ledger.note(outcome)
        say(progress_line(outcome, len(outcomes), len(todo), metric))

    status, start = "KILLED", time.perf_counter()
    try:
        if tasks:
            run_cell_tasks(tasks, first.resources, on_done, stopping)
        status = "FAILED" if any(o.status == "FAILED" for o in outcomes.values()) else "FINISHED"
        counts = Counter(o.status for o in outcomes.values())
        ended = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "nothing to run"
        say(f"sweep {sweep.id}: {ended} in {time.perf_counter() - start:.0f} s")
        return outcomes
    finally:
        if parent is not None:
            if status == "KILLED":
                parent.kill_running_cells(sweep)
            parent.end(status)


def progress_line(outcome: CellOutcome, count: int, total: int, metric: str | None) -> str:
    """``[3/12] fedavg_lr0.01_seed1 FINISHED in 41 s, eval/central/accuracy 0.912``."""
    head = f"[{count}/{total}] {outcome.cell} {outcome.status} in {outcome.seconds:.0f} s"
    if outcome.status == "FAILED":
        return f"{head}: {outcome.error}"
    shown = [key for key in (metric, *SHOWN_METRICS) if key is not None and key in outcome.final][:1]
    return f"{head}, {shown[0]} {outcome.final[shown[0]]:.4g}" if shown else head


def refuse_mixed_tracking(sweep: Sweep) -> None:
    """Every cell logs to the same store and experiment (the parent run lives in one)."""
    places = {
        (j.tracking.enabled, j.tracking.tracking_uri, j.tracking.experiment) for j in sweep.jobs.values()
    }
    if len(places) > 1:
        raise RaysimError(
            "sweep: the cells log to different MLflow stores or experiments "
            f"({sorted(map(str, places))}); set tracking in the job's base, not in a variant"
        )
