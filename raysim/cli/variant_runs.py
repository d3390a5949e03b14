"""``raysim run`` of a job's variants, one after another, and the table of those that finished.

A job file with ``variants:`` resumes at the variant level: a rerun of the same command skips the
variants that finished before (``raysim.cli.finished_variants``; ``--rerun-finished`` runs them
again), and Ctrl-C or SIGTERM still ends with the finished variants' table, their run links and
the command that runs the rest. A file without variants is one run, which ``--resume`` continues.

Exit status: that of ``raysim run``; a stop's own (130, 143) is left to the caller.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from raysim.cli.console import console
from raysim.cli.finished_variants import finished_before, note_finished, variant_tracker
from raysim.cli.home import raysim_home
from raysim.cli.run_links import print_run_links
from raysim.config import JobConfig

if TYPE_CHECKING:
    from raysim.engine.loop import RunResult
    from raysim.results.tables import RunRecord


def say(line: str) -> None:
    console.print(line, highlight=False, soft_wrap=True)


def run_variants(jobs: Sequence[JobConfig], args: argparse.Namespace, resume: str | None) -> int:
    """Runs the variants not finished before; prints the table of every finished one. On Ctrl-C
    or SIGTERM, prints the table of those finished so far and the command that runs the rest, and
    hands the stop on."""
    from raysim.engine.loop import run

    variants = has_variants(jobs)
    if variants:  # before the store is read for finished variants, or a variant's tracker opens it
        check_where_results_go(jobs, args.output_dir)
    skips = variants and resume is None and not args.rerun_finished  # --resume continues one run
    earlier = finished_before(jobs, args.output_dir, say) if skips else {}
    todo = [job for job in jobs if job.name not in earlier]
    if earlier:
        say(
            f"{len(earlier)} finished before, {len(todo)} to run ({', '.join(earlier)} skipped; "
            "--rerun-finished runs them again)"
        )
    results: list[RunResult] = []
    try:
        for job in todo:
            tracker = variant_tracker(job) if variants else None
            result = run(
                job, tracker=tracker, resume_from=resume, output_dir=args.output_dir, branch=args.branch
            )
            results.append(result)
            if variants:
                note_finished(result, args.output_dir)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM's exit (raysim.cli.driver)
        if variants and resume is None:
            print_finished(jobs, earlier, results)
            if len(results) < len(todo):
                say(rest_line(jobs, len(earlier) + len(results), todo[len(results)].name, args))
        raise
    return print_finished(jobs, earlier, results)


def check_where_results_go(jobs: Sequence[JobConfig], output_dir: str | Path) -> None:
    """The output folder and every variant's tracking store, checked as a run checks its own
    (``raysim.engine.preflight``): a bad URI or a file that is no store is one line, and left as
    it was, rather than opened by MLflow."""
    from raysim.engine.preflight import check_output_dir, check_tracking_store
    from raysim.tracking.tracking_store import tracking_uri

    check_output_dir(Path(output_dir), "runs")
    for uri in dict.fromkeys(tracking_uri(job.tracking) for job in jobs if job.tracking.enabled):
        check_tracking_store(uri)


def has_variants(jobs: Sequence[JobConfig]) -> bool:
    """The jobs are variants of a job file (``variants:``), not one run."""
    return any(job.origin is not None and job.origin.variant is not None for job in jobs)


def print_finished(jobs: Sequence[JobConfig], earlier: dict[str, RunRecord], results: list[RunResult]) -> int:
    """The finished variants' table (those of earlier commands too), where each run's time went,
    and their MLflow links; the exit status (3 when a store did not take all of a run)."""
    from raysim.engine.round_timer import time_summary
    from raysim.results.tables import RunRecord, summary_tables
    from raysim.tracking.outbox import UNSENT_EXIT_CODE, has_unsent

    fresh = {r.job.name: r for r in results}
    records = {name: RunRecord.of_result(r) for name, r in fresh.items()} | earlier
    if not records:
        return 0
    console.print(
        summary_tables([records[j.name] for j in jobs if j.name in records], "raysim runs (final round)")
    )
    for r in results:  # where each run's time went (its chart: time_per_round.png)
        if (summary := time_summary(r.history)) is not None:
            console.print(f"{r.job.name}: {summary}" if len(records) > 1 else summary, highlight=False)
    unsent = {name for name, r in fresh.items() if has_unsent(r.run_dir)}
    print_links([j for j in jobs if j.name in records and j.name not in unsent], records)
    return UNSENT_EXIT_CODE if unsent else 0


def print_links(jobs: Sequence[JobConfig], records: dict[str, RunRecord]) -> None:
    """Each tracked run's MLflow link, by store and experiment (variants may log to different ones)."""
    from raysim.tracking.tracking_store import tracking_uri

    stores: dict[tuple[str, str], list[str]] = {}
    for job in jobs:
        if (run_id := records[job.name].run_id) is not None:
            stores.setdefault((tracking_uri(job.tracking), job.tracking.experiment), []).append(run_id)
    for (uri, experiment), run_ids in stores.items():
        console.print(f"MLflow runs {', '.join(run_ids)} in {uri}, experiment {experiment!r}", soft_wrap=True)
        print_run_links(console, uri, run_ids)


def rest_line(jobs: Sequence[JobConfig], finished: int, stopped: str, args: argparse.Namespace) -> str:
    """``stopped in variant b: 1 of 3 variants finished; the same command runs the other 2 ...``."""
    rest = len(jobs) - finished
    return (
        f"stopped in variant {stopped}: {finished} of {len(jobs)} variants finished; the same command "
        f"runs the other {rest} (the finished ones are skipped): {run_command(args)}"
    )


def run_command(args: argparse.Namespace) -> str:
    """The ``raysim run`` command ``args`` came from (its job, overrides, variants, output folder)."""
    words = ["raysim", "run", args.config, *args.overrides]
    words += [flag for name in args.variant or [] for flag in ("--variant", name)]
    if args.output_dir != raysim_home():
        words += ["--output-dir", str(args.output_dir)]
    return shlex.join(words)
