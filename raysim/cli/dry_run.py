"""``raysim run --dry-run``'s summary: what the command would run (variants or cells x rounds x
cohort), about how long it would take here, where its results would go, the job's notes, and
the checks the run makes at its start (``raysim.engine.start_checks``). One screen, after the
resolved configs when ``--show-config`` asks for them.

Usage:
    print("\\n".join(summary(jobs, output_dir)))              # a job file's variants
    print("\\n".join(summary(cell_jobs, output_dir, sweep)))  # a sweep's chosen cells
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from raysim.bench.calibration import CACHE_FILE, Estimate, estimate_run
from raysim.cli.home import raysim_home
from raysim.config import JobConfig
from raysim.config.cells import Sweep
from raysim.data.store import ClientStore
from raysim.engine.start_checks import check_start
from raysim.tracking.tracking_store import tracking_uri


def summary(jobs: list[JobConfig], output_dir: str, sweep: Sweep | None = None) -> list[str]:
    """The summary's lines; raises the ConfigError a run would raise at its start."""
    checked = start_checks(jobs)
    estimates = [estimate_of(job, checked) for job in jobs]
    lines = [f"dry run: {workload(jobs, sweep)}; nothing started"]
    lines.append(f"  estimate  {estimate_line(estimates, jobs)}")
    lines += [f"  results   {line}" for line in results(jobs, output_dir, sweep)]
    skipped = sorted({reason for reason in checked.values() if isinstance(reason, str)})
    lines.append(
        f"  checks    {'; '.join(skipped) or 'passed: data, models and plugins as the run checks them'}"
    )
    notes = {job.note: job.name for job in jobs if job.note}  # a base's note once, not per variant
    lines += [
        f"  note      {text}" if len(jobs) == 1 else f"  note      {name}: {text}"
        for text, name in notes.items()
    ]
    return lines


def workload(jobs: list[JobConfig], sweep: Sweep | None) -> str:
    """``3 variants x 10 rounds x cohort 5 = 150 client trainings`` (or cells, for a sweep)."""
    trainings = sum(job.engine.num_rounds * job.engine.clients_per_round for job in jobs)
    shapes = Counter((job.engine.num_rounds, job.engine.clients_per_round) for job in jobs)
    unit = "cell" if sweep is not None else "variant"
    count = plural(len(jobs), unit)
    if sweep is not None:
        count += f" ({axes(sweep)})"
    if len(shapes) == 1:
        [(rounds, cohort)] = shapes
        return f"{count} x {rounds} rounds x cohort {cohort} = {trainings:,} client trainings"
    return f"{count}, {trainings:,} client trainings (rounds x cohort differ)"


def axes(sweep: Sweep) -> str:
    """How the cells are made: ``2 variants x 2 grid points x 3 seeds``, of how many in all."""
    variants = len({cell.variant for cell in sweep.cells})
    points = math.prod(len(sweep.spec.points(key)) for key in sweep.spec.grid)
    parts = [plural(variants, "variant"), plural(points, "grid point") if sweep.spec.grid else ""]
    if sweep.spec.random is not None:
        parts.append(plural(sweep.spec.random.samples, "random sample"))
    parts.append(plural(len({cell.seed for cell in sweep.cells}), "seed"))
    chosen = f"; {len(sweep.cells)} of {sweep.total} chosen" if len(sweep.cells) < sweep.total else ""
    return " x ".join(part for part in parts if part) + chosen


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def start_checks(jobs: list[JobConfig]) -> dict[str, ClientStore | str]:
    """Each distinct job's start checks (cells that differ only in seed or name are checked once):
    its store, or why they were skipped."""
    checked: dict[str, ClientStore | str] = {}
    for job in jobs:
        key = identity(job)
        if key not in checked:
            checked[key] = check_start(job)
    return checked


def identity(job: JobConfig) -> str:
    """The job but for what leaves its start checks as they are."""
    kept = {k: v for k, v in job.to_dict().items() if k not in ("name", "seed", "tracking", "note")}
    return json.dumps(kept, sort_keys=True, default=str)


def estimate_of(job: JobConfig, checked: dict[str, ClientStore | str]) -> Estimate | str:
    store = checked[identity(job)]
    if isinstance(store, str):
        return "unknown until the dataset is prepared"
    estimate = estimate_run(job, store, raysim_home())
    return estimate if estimate is not None else f"unknown: {job.algorithm.name} has no local SGD to time"


def estimate_line(estimates: list[Estimate | str], jobs: list[JobConfig]) -> str:
    """``~14 min on this machine, ... (rough: training 9 min, evaluation 2 min, overhead 3 min;
    ...)``, or why there is none."""
    unknown = [e for e in estimates if isinstance(e, str)]
    known = [e for e in estimates if isinstance(e, Estimate)]
    if not known:
        return unknown[0]
    parts = {
        "training": sum(e.training_s for e in known),
        "evaluation": sum(e.evaluation_s for e in known),
        "overhead": sum(e.overhead_s for e in known),
    }
    basis = known[0]
    text = (
        f"~{duration(sum(parts.values()))} on this machine, one after another (rough: "
        + ", ".join(f"{part} {duration(seconds)}" for part, seconds in parts.items())
        + f"; {basis.costs.step_s * 1000:.3g} ms a local step of {basis.basis}, "
        f"{basis.costs.forward_s * 1000:.2g} ms an evaluated example, "
        f"{basis.costs.client_s * 1000:.2g} ms a client's work outside its steps; raysim.bench.calibration, "
        f"cached in {Path(raysim_home()) / CACHE_FILE})"
    )
    return text + (f"; {len(unknown)} of {len(jobs)} not counted: {unknown[0]}" if unknown else "")


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def results(jobs: list[JobConfig], output_dir: str, sweep: Sweep | None) -> list[str]:
    """Where the run folders, the sweep's ledger and the MLflow runs would go."""
    lines = [f"run folders under {Path(output_dir) / 'runs'}/"]
    if sweep is not None:
        lines.append(f"sweep ledger {Path(output_dir) / 'sweeps' / (sweep.id + '.jsonl')}")
    places = dict.fromkeys(
        (tracking_uri(job.tracking), job.tracking.experiment) for job in jobs if job.tracking.enabled
    )
    lines += [f"MLflow {uri}, experiment {experiment!r}" for uri, experiment in places]
    if not places:
        lines.append("MLflow: none (tracking.enabled: false)")
    return lines


def resolved_configs(jobs: list[JobConfig]) -> str:
    """One YAML document per variant, headed by its name: the config ``raysim run`` would run,
    every default filled in."""
    import yaml

    return "".join(
        f"---\n# variant: {job.name}\n" + yaml.safe_dump(job.to_dict(), sort_keys=False) for job in jobs
    )
