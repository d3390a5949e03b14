"""A job file with a ``sweep:`` section as its cells' jobs, every one validated before anything runs.

Usage:
    sweep = load_sweep("jobs/sweeps/mnist_laptop.yaml", overrides=[], only=["variant=fedavg"])
    for cell in sweep.cells: sweep.jobs[cell.name]   # the cell's resolved JobConfig
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from raysim.config.evaluated import check_evaluated
from raysim.config.files import apply_overrides, flatten, load_jobs, read_job_file
from raysim.config.job import JobConfig, changes_no_model, check_folder_name
from raysim.config.mlflow_names import key_problem
from raysim.config.overrides import split_sweep
from raysim.config.sweep import Cell, SweepConfig, expand_cells, parse_only, parse_sweep, select, sweep_id
from raysim.errors import ConfigError


@dataclass(frozen=True)
class Sweep:
    """A sweep's id, its spec, the cells chosen to run and each one's job (by cell name)."""

    id: str
    job: str  # the job file's name (its top-level ``name``, else its stem)
    spec: SweepConfig
    cells: list[Cell]
    total: int  # cells before ``--variant`` / ``--only`` filters
    jobs: dict[str, JobConfig]


def has_sweep(path: str | Path) -> bool:
    """The job file has a ``sweep:`` section."""
    return "sweep" in read_job_file(Path(path))


def load_sweep(
    path: str | Path,
    overrides: list[str] | None = None,
    variants: list[str] | None = None,
    only: list[str] | None = None,
    confirm: bool = False,
) -> Sweep:
    """The sweep of a job file: its cells (only those the filters pass), each cell's job resolved.

    Raises:
        ConfigError: a bad sweep section, an axis key a variant lacks (its nearest key named), a
            stopping metric a variant does not log (its nearest named), a cell's invalid value,
            more cells than ``sweep.max_cells`` without ``confirm``, no cell passing the
            filters, a param or tag key MLflow would refuse, or cells logging to different
            MLflow experiments; every problem at once, before anything runs.
    """
    source, overrides = str(path), list(overrides or [])
    raw = read_job_file(Path(path))
    changes, job_overrides = split_sweep(overrides, source)  # sweep.seeds=[0]: a smaller sweep
    spec = parse_sweep(apply_overrides({"sweep": raw.pop("sweep")}, changes)["sweep"], source)
    filters = parse_only(only or [], spec)
    bases = load_jobs(path, overrides)  # every variant validated, as `raysim run` does without a sweep
    problems = check_axes(spec, bases) + check_stopping_metric(spec, bases)
    if problems:
        raise ConfigError(problems, source)
    cells = expand_cells(spec, {job.name: job.seed for job in bases})
    names = [cell.name for cell in cells]
    if twins := sorted({name for name in names if names.count(name) > 1}):
        fix = "give the values of an axis distinct names (cells are named by their values' text)"
        raise ConfigError([f"sweep: more than one cell is named {twins[0]!r}; {fix}"], source)
    chosen = select([c for c in cells if not variants or c.variant in variants], filters)
    if not chosen:
        raise ConfigError([f"sweep: no cell passes --variant {variants or []} --only {only or []}"], source)
    if len(chosen) > spec.max_cells and not confirm:
        raise ConfigError(
            [
                f"sweep: {len(chosen)} cells exceed sweep.max_cells ({spec.max_cells}); raise "
                f"sweep.max_cells, narrow it with --only, or pass --confirm-cells"
            ],
            source,
        )
    job_name = bases[0].origin.job if bases[0].origin is not None else bases[0].name
    try:
        check_folder_name(job_name)  # the sweep's id names its files (<output dir>/sweeps/<id>.jsonl)
    except ValueError as exc:
        raise ConfigError([f"name {job_name!r}: {exc}"], source) from None
    jobs = cell_jobs(path, overrides, chosen)
    base = apply_overrides(raw, job_overrides)
    sweep = Sweep(sweep_id(job_name, spec, base), job_name, spec, chosen, len(cells), jobs)
    if problems := check_mlflow_keys(sweep) + mixed_tracking(sweep):
        raise ConfigError(problems, source)
    return sweep


def mixed_tracking(sweep: Sweep) -> list[str]:
    """A problem when the cells log to different MLflow stores or experiments: the sweep's parent
    run lives in one, so the sweep would fail at its start."""
    places = {
        (j.tracking.enabled, j.tracking.tracking_uri, j.tracking.experiment) for j in sweep.jobs.values()
    }
    if len(places) < 2:
        return []
    return [
        f"sweep: the cells log to different MLflow stores or experiments ({sorted(map(str, places))}); "
        "set tracking in the job's base, not in a variant"
    ]


def sweep_params(spec: SweepConfig) -> dict[str, str]:
    """The sweep run's MLflow params: the spec, flattened under ``sweep.``."""
    return {f"sweep.{k}": str(v) for k, v in flatten(spec.model_dump(mode="json")).items()}


def check_mlflow_keys(sweep: Sweep) -> list[str]:
    """One problem per param or tag key MLflow would refuse, of the sweep run and of each cell's run
    (a named grid value's name becomes part of a key): the run would fail after it began."""
    sent = [("sweep", "the sweep run's params", sweep_params(sweep.spec))]
    for cell in sweep.cells:
        sent.append((f"cell {cell.name}", "its tags", cell.tags(sweep.id)))
        sent.append((f"cell {cell.name}", "its params", flatten(sweep.jobs[cell.name].to_dict())))
    problems, seen = [], set()
    for where, what, keys in sent:
        for key in keys:
            if key not in seen and (why := key_problem(key)) is not None:
                seen.add(key)
                problems.append(
                    f"{where}: MLflow would refuse the key {key!r} of {what} ({why}); rename the "
                    "grid value or key it comes from"
                )
    return problems


def check_axes(spec: SweepConfig, bases: list[JobConfig]) -> list[str]:
    """One problem per axis key some variant's resolved job lacks, naming that variant's nearest
    key, and per axis that cannot change the trained model (``changes_no_model``)."""
    problems = []
    for key in spec.axis_keys:
        where = f"sweep.grid.{key}" if key in spec.grid else f"sweep.random.axes.{key}"
        if changes_no_model(key):
            problems.append(
                f"{where}: says where the cells run or what they record, not what they train, so every "
                f"cell would train the same model; set it once for the whole sweep (key=value after the file)"
            )
            continue
        lacking = [job for job in bases if key not in _keys(job)]
        if not lacking:
            continue
        close = difflib.get_close_matches(key, sorted(_keys(lacking[0])), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else "; `raysim ls NAME` lists a plugin's keys"
        names = ", ".join(repr(job.name) for job in lacking)
        whom = "any variant" if len(lacking) == len(bases) > 1 else f"variant {names}"
        if len(bases) == 1:
            whom = "the job"
        problems.append(f"{where}: not a key of {whom}{hint}")
    return problems


def check_stopping_metric(spec: SweepConfig, bases: list[JobConfig]) -> list[str]:
    """A problem when ``sweep.stopping.metric`` is not an evaluation metric every variant logs
    (the median rule would never see it and no cell would ever stop)."""
    if spec.stopping is None:
        return []
    found = [(job.name, check_evaluated("sweep.stopping.metric", spec.stopping.metric, job)) for job in bases]
    lacking = [(name, problem) for name, problem in found if problem is not None]
    if not lacking:
        return []
    name, problem = lacking[0]
    return [problem if len(bases) == 1 else f"{problem} (variant {name!r})"]


def _keys(job: JobConfig) -> set[str]:
    """Every dotted key of the resolved job, sections included (``algorithm.local``)."""
    leaves = flatten(job.to_dict())
    sections = {".".join(key.split(".")[:i]) for key in leaves for i in range(1, key.count(".") + 1)}
    return set(leaves) | sections


def cell_jobs(path: str | Path, overrides: list[str], cells: list[Cell]) -> dict[str, JobConfig]:
    """Each cell's job: its variant with the cell's values and seed, named (and run-named) by the
    cell. Every cell's problems are reported at once."""
    jobs: dict[str, JobConfig] = {}
    problems: list[str] = []
    for cell in cells:
        try:
            check_folder_name(cell.name)
            job = load_jobs(path, [*overrides, *cell.overrides()], [cell.variant])[0]
        except (ConfigError, ValueError) as exc:
            found = exc.problems if isinstance(exc, ConfigError) else [f"name {cell.name!r}: {exc}"]
            problems += [f"cell {cell.name}: {p}" for p in found]
            continue
        origin = job.origin.job if job.origin is not None else job.name
        tracking = job.tracking.model_copy(update={"run_name": f"{origin}/{cell.label}"})
        jobs[cell.name] = job.model_copy(update={"name": cell.name, "tracking": tracking})
    if problems:
        raise ConfigError(problems, str(path))
    return jobs


def describe(sweep: Sweep) -> list[str]:
    """The dry run's listing: one line per cell, then the count."""
    lines = [
        f"sweep {sweep.id}: {len(sweep.cells)} cells"
        + (f" of {sweep.total}" if len(sweep.cells) < sweep.total else "")
    ]
    lines += [f"  {cell.name:<40} {cell.label}" for cell in sweep.cells]
    return lines
