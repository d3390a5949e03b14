"""``run(job)``: build everything, run the round loop (or the plugin's own protocol, or asynchronous
server steps: ``raysim.engine.async_rounds``), finish.

Usage:
    result = run(load_jobs("jobs/quickstart.yaml")[0])
    result.final["eval/central/accuracy"]
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from raysim.algorithm import has_protocol
from raysim.config import JobConfig
from raysim.engine.async_rounds import async_loop
from raysim.engine.build import build
from raysim.engine.engine import Engine, refuse_nonfinite
from raysim.engine.plots import learning_curve, time_per_round
from raysim.engine.preflight import check_output_dir
from raysim.engine.progress import RoundProgress
from raysim.sampling import CohortSchedule
from raysim.stop_request import exit_as_requested, honour_stop_request
from raysim.tracking.driver_lock import release_run_folder
from raysim.tracking.tracker import Tracker
from raysim.types import Metrics, ServerState

A = TypeVar("A")  # the algorithm's aggregate type
START_STEP = -1  # the step at which ``evaluation.at_start`` logs the initial model


@dataclass
class RunResult:
    """What a finished run leaves: final state and metrics, the per-round history, the run id."""

    job: JobConfig
    state: ServerState
    final: Metrics
    history: list[tuple[int, Metrics]]
    run_id: str | None
    run_dir: Path
    seconds: float


def run(
    job: JobConfig,
    *,
    tracker: Tracker | None = None,
    resume_from: str | None = None,
    output_dir: str | Path = ".raysim",
    branch: bool = False,
) -> RunResult:
    """Runs one simulation end to end and returns its result: what ``raysim run`` does for each
    variant of a job file, as a Python call (``raysim.run``).

    Args:
        job: one resolved job, e.g. ``raysim.load_jobs("jobs/quickstart.yaml", ["seed=1"])[0]``.
        tracker: where metrics go; default an MLflow run (``job.tracking``), or memory when
            ``tracking.enabled`` is false.
        resume_from: a checkpoint of an earlier run: its MLflow run continues when only
            ``engine.num_rounds`` changed, else (or with ``branch``) a child run of it starts.
        output_dir: where the run directory (checkpoints, client state, plots) is made.
        branch: start a child run from ``resume_from`` even where it could continue.

    Raises:
        RaysimError: a bad config, missing data or resources, a non-finite model (the MLflow run
            then ends FAILED).
    """
    start = time.perf_counter()
    check_output_dir(Path(output_dir), "runs")  # before data, workers or an MLflow run
    progress = RoundProgress(job.name, job.engine.num_rounds, enabled=job.tracking.progress)
    with exit_as_requested(), progress as bar:  # SIGTERM's 143, even where Ray made it 1
        engine, state = build(job, tracker, resume_from, Path(output_dir), branch)
        engine.on_phase, engine.on_log, status = bar.phase, bar.update, "FAILED"
        bar.resume_at(engine.start_round, engine.num_rounds)
        if has_protocol(engine.algorithm):
            bar.staged()
        try:
            if job.evaluation.at_start and engine.start_round == 0:
                engine.log(engine.evaluate(state), START_STEP)
            if has_protocol(engine.algorithm):
                state = engine.algorithm.protocol(engine, state)
            elif job.engine.asynchrony is not None:
                state = async_loop(engine, state, bar)
            else:
                state = round_loop(engine, state)
            bar.finished()
            bar.phase("finishing")
            result = finish(engine, state, time.perf_counter() - start)
            honour_stop_request()  # a SIGTERM whose exit was lost in the final writes or uploads
            status = "FINISHED"  # only once the final model is checked and saved
            return result
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (the CLI's and Ray's handlers exit)
            status = "KILLED"
            raise
        finally:
            try:
                engine.backend.shutdown()
            finally:  # the run's status is recorded even when the workers cannot be stopped cleanly
                release_run_folder(engine.run_dir)  # a continued run's lock; its MLflow run is
                engine.tracker.finish(status)  # RUNNING until here, so no other driver continues it


def round_loop(engine: Engine[A], state: ServerState) -> ServerState:
    """The default protocol: ``num_rounds`` identical rounds (fewer where a privacy budget stops the
    run), evaluated and logged when due (``Engine.log`` moves the progress bar)."""
    for round_num in range(engine.start_round, engine.num_rounds):
        state, metrics = engine.run_round(state, round_num)
        engine.end_round(state, round_num, metrics)
    return state


def run_cohorts(s: Engine[A]) -> CohortSchedule:
    """The cohorts of this run's rounds; a continued run (``--resume`` into its own folder) keeps
    those of its earlier rounds from the ``cohorts.json`` already there."""
    rounds = sorted(s.cohorts)
    first = rounds[0] if rounds else s.start_round
    cohorts = [s.cohorts[r] for r in rounds]
    earlier = s.run_dir / "cohorts.json"
    if s.start_round > 0 and earlier.is_file():
        before = CohortSchedule.load(earlier, s.store.num_clients)
        kept = before.cohorts[: max(0, first - before.first_round)]
        if before.first_round + len(kept) == first:  # no gap between the two legs
            cohorts, first = kept + cohorts, before.first_round
    return CohortSchedule(cohorts, s.store.num_clients, first)


def run_history(s: Engine[A]) -> list[tuple[int, Metrics]]:
    """Every round this run logged, saved as ``history.json`` in its folder: a continued run
    (``--resume`` into its own folder) keeps its earlier rounds, so its learning curve shows the
    whole run, as MLflow's charts do."""
    path = s.run_dir / "history.json"
    earlier = json.loads(path.read_text()) if s.start_round > 0 and path.is_file() else []
    history = [(int(step), m) for step, m in earlier if step < s.start_round] + s.history
    path.write_text(json.dumps(history))
    return history


def finish(s: Engine[A], state: ServerState, seconds: float) -> RunResult:
    """Final checkpoint, cohort schedule and learning curve as artifacts; the result."""
    last_round = max((r for r, _ in s.history), default=s.start_round - 1)  # logged in any order
    refuse_nonfinite(state.params, "the final global model", last_round)  # protocols too
    s.run_dir.mkdir(parents=True, exist_ok=True)
    title = f"{s.job.name}: {s.job.algorithm.name}, {s.job.model.name} on {s.job.dataset.name}"
    history = run_history(s)
    artifacts = [learning_curve(history, title, s.run_dir / "learning_curve.png")]
    if (times := time_per_round(history, title, s.run_dir / "time_per_round.png")) is not None:
        artifacts.append(times)
    run_cohorts(s).save(s.run_dir / "cohorts.json")
    artifacts.append(s.run_dir / "cohorts.json")
    final_checkpoint = s.checkpoint(state, last_round, "final.pt")  # always: a run can resume
    if s.job.tracking.log_checkpoint:
        artifacts.append(final_checkpoint)
    for path in artifacts:
        s.tracker.log_artifact(path)
    final: Metrics = {}
    for _, metrics in s.history:
        final |= metrics
    return RunResult(s.job, state, final, s.history, s.tracker.run_id, s.run_dir, seconds)
