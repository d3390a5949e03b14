"""``raysim run`` on a job file with a ``sweep:`` section: list its cells (``--dry-run``), or run
the ones not finished yet, concurrently on one Ray cluster (docs/sweeps.md).

Exit status: 0 when every cell finished (or was stopped by the median rule), 1 when a cell failed.
"""

from __future__ import annotations

import argparse
import os

from raysim.cli.console import console, err_console
from raysim.errors import RaysimError


def cmd_sweep(args: argparse.Namespace) -> int:
    from raysim.config.cells import describe, load_sweep

    if args.resume or args.branch:
        raise RaysimError("--resume continues one run; a sweep resumes by itself: run the same command again")
    sweep = load_sweep(args.config, args.overrides, args.variant, args.only, args.confirm_cells)
    if args.dry_run:
        from raysim.cli.dry_run import resolved_configs, summary

        jobs = [sweep.jobs[cell.name] for cell in sweep.cells]
        print(resolved_configs(jobs) if args.show_config else "", end="")
        print("\n".join([*describe(sweep), *summary(jobs, args.output_dir, sweep)]))
        return 0
    from raysim.cli.driver import exit_on_sigterm
    from raysim.stop_request import exit_as_requested
    from raysim.sweep.sweep_runs import run_sweep  # after --dry-run, which imports no Ray nor MLflow

    exit_on_sigterm()  # the sweep's run ends KILLED; its cells are cancelled, their runs end KILLED
    with exit_as_requested():  # SIGTERM's 143, which Ray's wait turns into SystemExit(1)
        outcomes = run_sweep(
            sweep,
            args.output_dir,
            lambda line: console.print(line, highlight=False, soft_wrap=True),
            rerun_finished=args.rerun_finished,
        )
    failed = [o for o in outcomes.values() if o.status == "FAILED"]
    for outcome in failed:
        if outcome.details and os.environ.get("RAYSIM_DEBUG"):
            err_console.print(outcome.details, highlight=False, soft_wrap=True)
    if failed:
        err_console.print(
            f"{len(failed)} of {len(sweep.cells)} cells failed ({', '.join(o.cell for o in failed)}); "
            "run the same command again to retry them (finished cells are skipped)",
            highlight=False,
            soft_wrap=True,
        )
    return 1 if failed else 0
