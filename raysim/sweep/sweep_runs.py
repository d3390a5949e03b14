"""A sweep run: one parent MLflow run, and each cell not finished yet as a concurrent Ray task
whose own run is that run's child (the tags: ``raysim.config.sweep``).

A rerun of the same sweep (the same id) goes on under the same parent run and skips the cells
whose run FINISHED (or was stopped by the median rule); failed and interrupted cells run again,
each in a new run beside its old one. Without tracking, the driver notes each cell's outcome in a
ledger file (``<output_dir>/sweeps/<sweep id>.jsonl``) and a rerun skips the ones noted finished.
One driver runs a sweep at a time (``raysim.sweep.sweep_lock``); the sweep's run ends FINISHED,
FAILED or KILLED with its driver, or KILLED by its sentinel (``raysim.sweep.sweep_parent``).

Usage:
    outcomes = run_sweep(load_sweep("jobs/sweeps/mnist_laptop.yaml"), ".raysim", print)
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from raysim.config import JobConfig, JobOrigin, validate_job
from raysim.config.cells import Sweep, mixed_tracking
from raysim.config.sweep import ERROR_TAG, STOPPED_TAG, Cell
from raysim.engine.loop import run
from raysim.engine.preflight import check_output_dir, check_tracking_store
from raysim.errors import RaysimError
from raysim.stop_request import clear_stop_request, note_stop_request
from raysim.sweep.cell_ledger import CellLedger, CellOutcome, Status
from raysim.sweep.ray_cells import CellTask, Reporter, run_cell_tasks
from raysim.sweep.report_hint import report_command
from raysim.sweep.sweep_lock import hold_sweep, release_sweep
from raysim.sweep.sweep_parent import SweepRun
from raysim.tracking.tracker import MemoryTracker, MlflowTracker, Tracker
from raysim.tracking.tracking_store import tracking_uri
from raysim.types import Metrics

SHOWN_METRICS = ("eval/central/accuracy", "eval/clients/accuracy")  # a cell's progress line, when logged
STOPPED_EXIT_CODE = 0  # the SystemExit that ends a cell the median rule stopped


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


def _shipped(job: JobConfig) -> tuple[dict[str, Any], JobOrigin | None]:
    return job.to_dict(), job.origin


def cell_resources(job: JobConfig) -> tuple[float, float]:
    """A cell's share of the cluster: one worker's CPUs and GPU fraction. The serial backend trains
    the cell's virtual workers one after another in one process with that many torch threads.
    ``gpus_per_worker: auto`` is the whole card there, as on the serial backend."""
    gpus = job.resources.gpus_per_worker
    return job.resources.cpus_per_worker, 1.0 if gpus == "auto" else gpus


def run_sweep(
    sweep: Sweep, output_dir: str | Path, say: Callable[[str], None], rerun_finished: bool = False
) -> dict[str, CellOutcome]:
    """Runs the sweep's cells not finished before (every cell with ``rerun_finished``),
    concurrently; ``say`` gets a line per cell as it ends, and the ``raysim report`` command of a
    tracked sweep at the end. Returns the outcome of each cell run now (a finished one from before
    is not in it).

    Raises:
        RaysimError: another driver runs this sweep (``raysim.sweep.sweep_lock``; its pid and host
            named), an output folder that cannot be written, cells that no node can hold, mixed
            tracking stores.
    """
    refuse_mixed_tracking(sweep)
    check_output_dir(Path(output_dir), "sweeps", "runs")  # one named error, not the lock's OSError
    first = sweep.jobs[sweep.cells[0].name]
    if first.tracking.enabled:  # the sweep's run opens before any cell's own preflight
        check_tracking_store(tracking_uri(first.tracking))
    hold = hold_sweep(sweep.id, output_dir)  # a second driver of this sweep stops here
    try:
        if hold.dead_driver:
            say(f"sweep {sweep.id}: going on from {hold.dead_driver}, which no longer runs")
        parent = SweepRun.open(sweep, first, hold.dead_driver, say) if first.tracking.enabled else None
        return run_held(sweep, output_dir, say, parent, rerun_finished)
    finally:
        release_sweep(hold)


def run_held(
    sweep: Sweep,
    output_dir: str | Path,
    say: Callable[[str], None],
    parent: SweepRun | None,
    rerun_finished: bool = False,
) -> dict[str, CellOutcome]:
    """``run_sweep`` once this driver holds the sweep (and its MLflow run, when tracked): the sweep
    run ends FINISHED, FAILED (a cell or the driver failed) or KILLED (Ctrl-C, SIGTERM)."""
    status = "FAILED"
    try:
        outcomes = run_todo(sweep, output_dir, say, parent, rerun_finished)
        status = "FAILED" if any(o.status == "FAILED" for o in outcomes.values()) else "FINISHED"
        return outcomes
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM's exit (raysim.cli.driver)
        status = "KILLED"
        raise
    finally:
        if parent is not None:
            if status != "FINISHED":  # cells whose workers ended before their own clean-up
                parent.kill_running_cells()
            parent.end(status)


def run_todo(
    sweep: Sweep,
    output_dir: str | Path,
    say: Callable[[str], None],
    parent: SweepRun | None,
    rerun_finished: bool = False,
) -> dict[str, CellOutcome]:
    """Runs the cells not finished before, concurrently; a line as each ends, and one at the end."""
    ledger = CellLedger.of(sweep, output_dir)  # used only without tracking
    if rerun_finished:
        done: set[str] = set()
    else:
        done = parent.finished_cells() if parent is not None else ledger.finished_cells(say)
    todo = [cell for cell in sweep.cells if cell.name not in done]
    where = f"MLflow run {parent.run_id}" if parent is not None else f"untracked: outcomes in {ledger.path}"
    say(
        f"sweep {sweep.id}: {len(sweep.cells)} cells, {len(sweep.cells) - len(todo)} finished before, "
        f"{len(todo)} to run ({where})"
    )
    metric = sweep.spec.stopping.metric if sweep.spec.stopping is not None else None
    outcomes: dict[str, CellOutcome] = {}

    def on_done(name: str, result: Any) -> None:
        outcomes[name] = outcome = as_outcome(name, result)
        if parent is None:
            ledger.note(outcome)
        say(progress_line(outcome, len(outcomes), len(todo), metric))

    start = time.perf_counter()
    if todo:
        tasks = cell_tasks(sweep, todo, parent.run_id if parent is not None else None, output_dir)
        run_cell_tasks(tasks, sweep.jobs[sweep.cells[0].name].resources, on_done, sweep.spec.stopping)
    counts = Counter(o.status for o in outcomes.values())
    ended = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "nothing to run"
    say(f"sweep {sweep.id}: {ended} in {time.perf_counter() - start:.0f} s")
    if parent is not None:  # its table: raysim report reads the runs from MLflow
        say(f"its table: {report_command(sweep, outcomes.values(), parent.tracker.uri)}")
    return outcomes


def cell_tasks(
    sweep: Sweep, cells: list[Cell], parent_id: str | None, output_dir: str | Path
) -> list[CellTask]:
    """A Ray task per cell, reserving one worker's share of the cluster."""
    stopping = sweep.spec.stopping
    return [
        CellTask(
            cell.name,
            partial(
                run_cell,
                *_shipped(sweep.jobs[cell.name]),
                cell.tags(sweep.id),
                parent_id,
                str(output_dir),
                stopping.metric if stopping is not None else None,
                rule=stopping.rule if stopping is not None else "median",
            ),
            *cell_resources(sweep.jobs[cell.name]),
        )
        for cell in cells
    ]


def as_outcome(name: str, result: Any) -> CellOutcome:
    """A cell's outcome from what its task returned, or the exception it ended with."""
    if isinstance(result, CellOutcome):
        return result
    status: Status = "KILLED" if isinstance(result, KeyboardInterrupt) else "FAILED"
    return CellOutcome(name, status, error=f"{type(result).__name__}: {result}")


def progress_line(outcome: CellOutcome, count: int, total: int, metric: str | None) -> str:
    """``[3/12] fedavg_lr0.01_seed1 FINISHED in 41 s, eval/central/accuracy 0.912``."""
    head = f"[{count}/{total}] {outcome.cell} {outcome.status} in {outcome.seconds:.0f} s"
    if outcome.status == "FAILED":
        return f"{head}: {outcome.error}"
    shown = [key for key in (metric, *SHOWN_METRICS) if key is not None and key in outcome.final][:1]
    return f"{head}, {shown[0]} {outcome.final[shown[0]]:.4g}" if shown else head


def refuse_mixed_tracking(sweep: Sweep) -> None:
    """Every cell logs to the same store and experiment (the parent run lives in one); the check
    ``load_sweep`` (and so the dry run) makes too, for a Sweep made without it."""
    if problems := mixed_tracking(sweep):
        raise RaysimError(problems[0])
