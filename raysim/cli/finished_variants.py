"""Which variants of a job finished before: a rerun of ``raysim run`` skips them, as a rerun of a
sweep skips its finished cells.

A variant is known by its fingerprint: its name and a hash of what it computes (its job's name
and its resolved config, less ``tracking`` and ``resources``: where and how it runs). A tracked
variant's MLflow run carries it as a tag, and a FINISHED run with it in the variant's experiment
counts. An untracked variant's end is noted, as an untracked sweep's cells are, in a ledger:
``<output dir>/variants/<job>.jsonl`` (``raysim.sweep.cell_ledger``).

Usage:
    earlier = finished_before(jobs, ".raysim", print)   # {variant: RunRecord}
    result = run(job, tracker=variant_tracker(job), ...)
    note_finished(result, ".raysim")
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.config import JobConfig
from raysim.config.job import changes_no_model

if TYPE_CHECKING:
    from raysim.engine.loop import RunResult
    from raysim.results.tables import RunRecord
    from raysim.sweep.cell_ledger import CellLedger
    from raysim.tracking.tracker import Tracker

FINGERPRINT_TAG = "raysim.job_fingerprint"


def job_fingerprint(job: JobConfig) -> str:
    """``fedavg-1a2b3c4d5e6f``: the variant's name and a hash of its job's name and what its config
    computes: not where and how it runs or is recorded (``changes_no_model``: tracking, workers),
    nor its ``note``; the arithmetic (``resources.precision``, ...) it keeps."""
    config = {k: v for k, v in job.to_dict().items() if k not in ("tracking", "note")}
    config["resources"] = {
        k: v for k, v in config["resources"].items() if not changes_no_model(f"resources.{k}")
    }
    origin = job.origin.job if job.origin is not None else job.name
    text = json.dumps([origin, config], sort_keys=True, default=str)
    return f"{job.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def variant_tracker(job: JobConfig) -> Tracker | None:
    """The variant's MLflow run, tagged with its fingerprint; None (the default) when untracked."""
    from raysim.tracking.tracker import MlflowTracker

    if not job.tracking.enabled:
        return None
    return MlflowTracker(job.tracking, tags={FINGERPRINT_TAG: job_fingerprint(job)})


def ledger(job: JobConfig, output_dir: str | Path) -> CellLedger:
    """The ledger of the untracked variants of ``job``'s file, in the output folder."""
    from raysim.sweep.cell_ledger import CellLedger

    name = job.origin.job if job.origin is not None else job.name
    return CellLedger(Path(output_dir) / "variants" / f"{name}.jsonl")


def note_finished(result: RunResult, output_dir: str | Path) -> None:
    """Notes an untracked variant's end in the ledger (a tracked one's run carries its tag)."""
    from raysim.sweep.cell_ledger import CellOutcome

    if not result.job.tracking.enabled:
        outcome = CellOutcome(job_fingerprint(result.job), "FINISHED", None, result.final, result.seconds)
        ledger(result.job, output_dir).note(outcome)


def finished_before(
    jobs: Sequence[JobConfig], output_dir: str | Path, say: Callable[[str], None]
) -> dict[str, RunRecord]:
    """The variants that finished before (by name), each with its record for the final table:
    its latest FINISHED run's, or what the ledger noted of an untracked one.

    Raises:
        ResourceError: a tracking store that cannot be read.
    """
    found: dict[str, RunRecord] = {}
    noted: dict[Path, dict[str, dict[str, Any]]] = {}
    for job in jobs:
        if job.tracking.enabled:
            record = tracked_record(job)
        else:
            book = ledger(job, output_dir)
            if book.path not in noted:
                noted[book.path] = book.finished(say)
            record = noted_record(job, noted[book.path].get(job_fingerprint(job)))
        if record is not None:
            found[job.name] = record
    return found


def tracked_record(job: JobConfig) -> RunRecord | None:
    """The record of the variant's latest FINISHED run with its fingerprint; None if none."""
    from mlflow.tracking import MlflowClient

    from raysim.results.run_store import RunStore
    from raysim.tracking.outbox import outage_as_error
    from raysim.tracking.tracking_store import sqlite_path, tracking_uri

    uri = tracking_uri(job.tracking)
    database = sqlite_path(uri)
    if database is not None and not database.is_file():  # no store yet: nothing ran
        return None
    with outage_as_error(uri, "be read"):
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(job.tracking.experiment)
        if experiment is None:
            return None
        query = f"tags.`{FINGERPRINT_TAG}` = '{job_fingerprint(job)}' and attributes.status = 'FINISHED'"
        runs = client.search_runs(
            [experiment.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1
        )
        if not runs:
            return None
        [record] = RunStore(uri).records(runs, metrics=None)
    return replace(record, name=job.name)  # as the runs of this command are named in its table


def noted_record(job: JobConfig, noted: dict[str, Any] | None) -> RunRecord | None:
    """The record of an untracked variant the ledger noted finished (its final metrics, no curve)."""
    from raysim.results.tables import RunRecord

    if noted is None:
        return None
    final, seconds = noted.get("final") or {}, noted.get("seconds")
    return RunRecord(job.name, job.algorithm.name, dict(final), [], float(seconds) if seconds else None)
