"""The ``raysim`` command: run, submit, prepare, ls, ui, server, bench, analyze, eval, compare, runs, report,
track.

User errors (bad config, missing data, resources) print one clear message and exit 2, without a
traceback; ``RAYSIM_DEBUG=1`` shows the traceback too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from raysim.cli import compare, eval_checkpoint, ls, report, runs, submit, track
from raysim.cli.arg_types import positive_int
from raysim.cli.console import console, err_console
from raysim.cli.driver import exit_on_sigterm, quiet_startup
from raysim.cli.home import raysim_home
from raysim.cli.ui import add_server_parser, add_ui_parser
from raysim.errors import RaysimError
from raysim.tracking.store_calls import bound_store_calls

if TYPE_CHECKING:  # the commands import their modules lazily: `raysim ls` stays fast
    from pydantic import BaseModel

    from raysim.config import JobConfig
    from raysim.data.integrity import StoreCheck
    from raysim.data.store import ClientStore


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _parsers()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow options (`--variant a x.y=1`): argparse leaves them over
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    command = commands[args.command]
    if stray and hasattr(args, "overrides") and not any(item.startswith("-") for item in stray):
        command.error(f"override {stray[0]!r}: expected key.sub=value")  # as one before the options
    if stray:
        command.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        if not hasattr(args, "overrides"):
            command.error(f"{args.command} takes no key=value overrides: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    quiet_startup()
    bound_store_calls()  # before any MLflow call, here or in a sentinel or job this process starts
    try:
        return args.handler(args)
    except RaysimError as exc:
        if os.environ.get("RAYSIM_DEBUG"):
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


def _parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """raysim's parser, and each command's own (whose usage an error after parsing shows)."""
    parser = argparse.ArgumentParser(prog="raysim", description="Federated-learning simulator on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a job (every variant in it), log to MLflow")
    run.add_argument("config", help="job YAML, e.g. jobs/quickstart.yaml")
    run.add_argument(
        "overrides",
        nargs="*",
        help="key.sub=value overrides of every variant, VARIANT:key.sub=value of one (=!unset drops a key)",
    )
    run.add_argument("--variant", action="append", help="run only this variant (repeatable)")
    run.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="continue from a checkpoint written by an earlier run (a file, a run folder, or an MLflow "
        "run id or name: its final.pt): in the same MLflow run when only engine.num_rounds changed, "
        "else in a new run tagged with its parent",
    )
    run.add_argument(
        "--branch", action="store_true", help="with --resume: always start a new (child) MLflow run"
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the job, run the checks its start makes, and print a summary: variants (or "
        "cells) x rounds x cohort, an estimate of its time here, where results go; start nothing",
    )
    run.add_argument(
        "--show-config",
        action="store_true",
        help="with --dry-run: print each variant's (cell's) resolved config, as YAML, above the summary",
    )
    run.add_argument(
        "--rerun-finished",
        action="store_true",
        help="run every variant (or sweep cell), also those a run of the same job finished before",
    )
    run.add_argument(
        "--only",
        action="append",
        metavar="KEY=VALUE,...",
        help="a sweep: run only the cells with these axis values, e.g. variant=fedavg,seed=1 "
        "(repeatable: a cell runs when it matches one)",
    )
    run.add_argument(
        "--confirm-cells", action="store_true", help="a sweep: run more cells than sweep.max_cells"
    )
    run.add_argument(
        "--output-dir",
        default=raysim_home(),
        help="where run directories (checkpoints, client state) go",
    )
    run.set_defaults(handler=cmd_run)

    prepare = sub.add_parser("prepare", help="build (or resume) a dataset's client store offline")
    prepare.add_argument("target", help="a dataset recipe (raysim ls datasets) or a job YAML")
    prepare.add_argument(
        "overrides", nargs="*", help="key=value options of the recipe (dataset.KEY=value for a job)"
    )
    prepare.add_argument(
        "--verify", action="store_true", help="hash every file of the store(s) against its recorded checksum"
    )
    prepare.add_argument(
        "--rehash", action="store_true", help="record per-file checksums in a store prepared before them"
    )
    prepare.set_defaults(handler=cmd_prepare)

    ls.add_parser(sub)

    add_ui_parser(sub)
    add_server_parser(sub)

    bench = sub.add_parser("bench", help="raysim vs a plain PyTorch loop on the same client trainings")
    bench.add_argument("config", help="benchmark YAML, e.g. jobs/bench/pfl_cifar10.yaml")
    bench.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    bench.set_defaults(handler=cmd_bench)
    _add_analyze(sub)
    eval_checkpoint.add_parser(sub)
    compare.add_parser(sub)
    report.add_parser(sub)
    runs.add_parser(sub)
    submit.add_parser(sub)
    track.add_parser(sub)
    return parser, dict(sub.choices)


MODEL_HELP = "a model of the run: final, init, round:N (its checkpoint of round N) or a checkpoint file"


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    analyze = sub.add_parser(
        "analyze",
        help="loss landscape between a finished run's models, logged back to that MLflow run",
        description="Evaluates the models of a finished run (MLflow RUN_ID) along a line or on a "
        "plane, on the central test set (or --clients K), over the run's workers; logs the "
        "metrics (analysis/...) and PNGs back to the same run. A model (A, B, C) is final, init, "
        "round:N (the run's checkpoint of round N) or a checkpoint file.",
    )
    analyze.add_argument("run_id", metavar="RUN_ID", help="an MLflow run id or a run name")
    tools = analyze.add_subparsers(dest="tool", required=True, metavar="TOOL")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--tracking-uri", help="the run's store; default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db"
    )
    common.add_argument("--workers", type=int, help="number of workers (default: the job's resources)")
    common.add_argument(
        "--serial", action="store_true", help="evaluate in this process (resources.backend=serial)"
    )
    common.add_argument(
        "--clients",
        type=positive_int,
        metavar="K",
        help="pool the test splits of K of the run's evaluated clients (default: the central test set)",
    )
    line = tools.add_parser(
        "line", parents=[common], help="loss and accuracy along the line A-B, both barriers, PNG"
    )
    line.add_argument("a", metavar="A", help=MODEL_HELP + " (alpha 1)")
    line.add_argument("b", metavar="B", help=MODEL_HELP + " (alpha 0)")
    line.add_argument("--points", type=int, default=11, help="alphas in --range (0 and 1 are always added)")
    line.add_argument(
        "--range",
        type=float,
        nargs=2,
        default=[0.0, 1.0],
        metavar=("LOW", "HIGH"),
        help="alpha range; e.g. -0.5 1.5 extrapolates past both models",
    )
    barrier = tools.add_parser(
        "barrier", parents=[common], help="the loss and accuracy barriers of A-B (11 points)"
    )
    barrier.add_argument("a", metavar="A", help=MODEL_HELP)
    barrier.add_argument("b", metavar="B", help=MODEL_HELP)
    plane = tools.add_parser(
        "plane", parents=[common], help="loss and error contours on the plane through A, B, C"
    )
    for name in ("a", "b", "c"):
        plane.add_argument(name, metavar=name.upper(), help=MODEL_HELP)
    trajectory = tools.add_parser(
        "trajectory", parents=[common], help="the plane through the last three checkpointed global models"
    )
    for tool in (plane, trajectory):
        tool.add_argument("--size", type=int, default=21, help="grid points per side")
        tool.add_argument(
            "--padding",
            type=float,
            default=0.3,
            help="margin around the models, as a fraction of their extent",
        )
    analyze.set_defaults(handler=cmd_analyze)


def cmd_run(args: argparse.Namespace) -> int:
    from raysim.config import load_jobs, probes_never_due
    from raysim.config.cells import has_sweep

    if args.show_config and not args.dry_run:  # else a real run would start, printing no config
        raise RaysimError("--show-config prints each variant's config with --dry-run: add --dry-run")
    if has_sweep(args.config):
        from raysim.cli.sweep_command import cmd_sweep

        return cmd_sweep(args)
    if args.only or args.confirm_cells:
        raise RaysimError(
            f"--only and --confirm-cells pick a sweep's cells; {args.config} has no sweep: section"
        )
    jobs = load_jobs(args.config, args.overrides, args.variant)
    if args.resume and len(jobs) > 1:
        raise RaysimError("--resume continues one run: pick one with --variant NAME")
    if args.branch and not args.resume:
        raise RaysimError("--branch starts a run from a checkpoint: give it with --resume CHECKPOINT")
    if args.dry_run:
        from raysim.cli.dry_run import resolved_configs, summary

        if args.resume:  # the checkpoint's own checks, as the run makes them before its data
            check_resume(args.resume, jobs[0], args.branch)
        if args.show_config:
            print(resolved_configs(jobs), end="")
        for job in jobs:
            for warning in probes_never_due(job):
                print(f"warning: variant {job.name}: {warning}", file=sys.stderr)
        print("\n".join(summary(jobs, args.output_dir)))
        return 0
    from raysim.cli.variant_runs import run_variants  # after --dry-run: it imports no Ray nor MLflow

    exit_on_sigterm()  # the run's finally ends it as KILLED and stops its workers
    with tempfile.TemporaryDirectory(prefix="raysim-resume-") as scratch:  # a run's final.pt, fetched
        resume = resume_checkpoint(args.resume, jobs[0], Path(scratch)) if args.resume else None
        return run_variants(jobs, args, resume)


def resume_checkpoint(target: str, job: JobConfig, scratch: Path) -> str:
    """``--resume``'s checkpoint: a file, a run folder's ``final.pt``, or a run's (by MLflow run
    id or name) in the job's store."""
    from raysim.results.checkpoint_eval import find_checkpoint
    from raysim.tracking.tracking_store import tracking_uri

    return str(find_checkpoint(target, tracking_uri(job.tracking), scratch))


def check_resume(target: str, job: JobConfig, branch: bool) -> None:
    """What ``--dry-run --resume`` checks: the checkpoint found, and as the run checks it before
    opening its data (``resumable_checkpoint``)."""
    from raysim.engine.resumed_state import resumable_checkpoint

    with tempfile.TemporaryDirectory(prefix="raysim-resume-") as scratch:
        resumable_checkpoint(resume_checkpoint(target, job, Path(scratch)), job, branch)


def cmd_prepare(args: argparse.Namespace) -> int:
    from raysim.data.integrity import rehash_store, verify_store
    from raysim.data.prepare import prepare_store
    from raysim.data.store import ClientStore
    from raysim.errors import DataError

    problems = []
    for name, config in prepare_targets(args.target, args.overrides):
        path = prepare_store(name, config)
        console.print(f"store {path}", soft_wrap=True, highlight=False)
        if args.verify or args.rehash:
            try:
                check = (rehash_store if args.rehash else verify_store)(path)
            except DataError as exc:  # every store is checked before the command fails
                problems.append(str(exc))
                console.print("[bold red]FAILED[/] (below)")
                continue
            console.print(verdict(check, args), soft_wrap=True, highlight=False)
        console.print(store_summary(ClientStore.open(path)), soft_wrap=True, highlight=False)
    if problems:
        raise DataError("\n".join(problems))
    return 0


def verdict(check: StoreCheck, args: argparse.Namespace) -> str:
    """One line: what ``raysim prepare --verify`` or ``--rehash`` found."""
    size = f"{check.num_files} files, {check.num_bytes / 2**20:,.1f} MiB"
    if check.has_checksums:
        return f"OK: {size}{' recorded and' if args.rehash else ''} match their checksums"
    command = " ".join(["raysim prepare", *map(shlex.quote, [args.target, *args.overrides]), "--rehash"])
    return (
        f"OK: {size} match the store's content hash, but it has no per-file checksums (prepared "
        f"by an older raysim); record them with: {command}"
    )


def prepare_targets(target: str, overrides: list[str]) -> list[tuple[str, BaseModel]]:
    """(recipe name, validated dataset config) pairs: a job's datasets (each variant's, once) or
    one recipe with ``key=value`` options."""
    from pydantic import ValidationError

    from raysim import registry
    from raysim.config import apply_overrides, explain, load_jobs
    from raysim.errors import ConfigError
    from raysim.registry import plugin_config

    if target.endswith((".yaml", ".yml")) or os.path.isfile(target):
        sections = []
        for job in load_jobs(target, overrides):
            sections.append((job.dataset.name, job.dataset.config))
            for transfer in job.evaluation.transfer:  # evaluation-only datasets are built too
                options = {k: v for k, v in transfer.dataset.items() if k != "name"}
                recipe = registry.get("dataset", str(transfer.dataset.get("name", "")))
                try:
                    sections.append((recipe.name, plugin_config(recipe.config, options)))
                except ValidationError as exc:
                    raise ConfigError(
                        explain(exc, recipe.config, prefix="evaluation.transfer.dataset."), target
                    ) from None
        return list({(n, c.model_dump_json()): (n, c) for n, c in sections}.values())
    entry = registry.get("dataset", target)
    try:
        return [(target, plugin_config(entry.config, apply_overrides({}, overrides)))]
    except ValidationError as exc:
        raise ConfigError(explain(exc, entry.config, prefix="dataset."), target) from None


def store_summary(store: ClientStore) -> str:
    """Clients, sequences (rows) and, for text stores, tokens and documents of a store."""
    meta, rows = store.meta, store.meta["num_rows"]
    train, test = int(store.num_examples("train").sum()), int(store.num_examples("test").sum())
    lines = [
        f"{meta.get('recipe', '?')}: {store.num_clients:,} clients, {rows:,} "
        f"{'sequences' if 'tokenizer' in meta else 'rows'} (train {train:,}, test {test:,})"
    ]
    if "tokenizer" in meta:
        tok = meta["tokenizer"]
        lines.append(
            f"{meta['num_tokens']:,} tokens (seq_len {meta['seq_len']}, tokenizer "
            f"{tok['name']}, vocab {tok['vocab_size']:,}); {meta['num_documents']:,} "
            f"documents read, {meta['num_skipped_documents']:,} skipped; "
            f"{meta['num_dropped_clients']:,} clients below min_sequences dropped"
        )
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    from raysim.bench.round_bench import run_benchmark

    run_benchmark(args.config, args.overrides, console)
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from raysim.cli.analyze import run_analysis

    return run_analysis(args, console)


if __name__ == "__main__":
    sys.exit(main())
