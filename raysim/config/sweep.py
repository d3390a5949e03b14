"""A job file's ``sweep:`` section: seeds, grid and random axes over dotted config keys, crossed
with the file's variants. A cell is one (variant, grid point, random sample, seed): one simulation,
one MLflow run, the child of the sweep's parent run.

    sweep:
      seeds: [0, 1, 2]                         # the job's `seed` (default: the job's own)
      grid: {algorithm.local.lr: [0.01, 0.1]}  # every combination of the listed values
      # a mapping names its values (the cells' names and axis tags use the names):
      #   grid: {dataset.partition: {shards: {kind: shards}, dir0.1: {kind: dirichlet, alpha: 0.1}}}
      random:                                  # `samples` joint draws, from the sweep's `seed`
        samples: 4
        axes: {algorithm.mu: {log_uniform: [0.001, 0.1]}}
      max_cells: 64                            # more cells need `raysim run --confirm-cells`
      stopping: {metric: eval/central/accuracy, mode: max, grace_rounds: 5}  # median stopping

Cells come variant by variant, then grid point, random sample and seed (the last varies fastest).
Random draws are a pure function of ``sweep.seed``: the same for every variant and on every run.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from raysim.config.plugins import explain
from raysim.errors import ConfigError

DEFAULT_MAX_CELLS = 64
FILTER_KEYS = ("variant", "seed")  # what ``--only`` takes besides the sweep's axis keys

# The tag contract (``raysim report`` reads exactly these). The sweep's parent run: KIND_TAG =
# SWEEP_KIND and SWEEP_TAG = the sweep's id. Each cell's run: SWEEP_TAG, CELL_TAG = the cell's
# name, and AXIS_TAG + "variant", + "seed" and + each grid or random axis's dotted key, valued as
# ``str(value)``. A cell stopped early also has STOPPED_TAG = the rule ("median", "asha"); a failed cell
# has ERROR_TAG = its error's type and message. The sweep's run also has DRIVER_TAG = the driver that
# runs it, or ran it last (``pid 4242 on node-7, started ... UTC``).
KIND_TAG = "raysim.kind"
SWEEP_KIND = "sweep"
SWEEP_TAG = "raysim.sweep"
CELL_TAG = "raysim.cell"
AXIS_TAG = "raysim.axis."
STOPPED_TAG = "raysim.stopped"
ERROR_TAG = "raysim.error"
DRIVER_TAG = "raysim.driver"


class Distribution(BaseModel, frozen=True, extra="forbid"):
    """One random axis: exactly one of ``log_uniform: [low, high]``, ``uniform: [low, high]`` or
    ``choice: [a, b, ...]``."""

    log_uniform: tuple[float, float] | None = None
    uniform: tuple[float, float] | None = None
    choice: list[Any] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        given = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of log_uniform: [low, high], uniform: [low, high], choice: [...]"
            )
        low_high = self.log_uniform or self.uniform
        if low_high is not None and not low_high[0] < low_high[1]:
            raise ValueError(f"needs low < high, got {list(low_high)}")
        if self.log_uniform is not None and self.log_uniform[0] <= 0:
            raise ValueError(f"log_uniform needs 0 < low, got {list(self.log_uniform)}")
        return self

    def draw(self, rng: np.random.Generator) -> Any:
        if self.log_uniform is not None:
            low, high = np.log(self.log_uniform)
            return float(np.exp(rng.uniform(low, high)))
        if self.uniform is not None:
            return float(rng.uniform(*self.uniform))
        assert self.choice is not None  # exactly one kind is set
        return self.choice[int(rng.integers(len(self.choice)))]


class RandomAxes(BaseModel, frozen=True, extra="forbid"):
    samples: int = Field(ge=1)  # joint draws of every axis below
    axes: dict[str, Distribution] = Field(min_length=1)  # dotted key -> its distribution


class StoppingConfig(BaseModel, frozen=True, extra="forbid"):
    """Early stopping of clearly losing cells. ``rule: median``: after ``grace_rounds`` rounds, a
    cell whose best ``metric`` so far is worse than the median of the other cells' running
    averages at the same round stops (once at least ``min_cells`` cells reported that round).
    ``rule: asha``: at rungs of ``grace_rounds * reduction_factor**k`` rounds a cell goes on only
    if its value is in the best ``1 / reduction_factor`` recorded at that rung so far."""

    metric: str  # a metric the cells log, e.g. eval/central/accuracy
    mode: Literal["max", "min"]  # max: higher is better
    rule: Literal["median", "asha"] = "median"
    grace_rounds: int = Field(1, ge=1)  # no cell stops before it logged this many rounds
    min_cells: int = Field(3, ge=2)  # median: cells that must have reached the round to compare against
    reduction_factor: int = Field(3, ge=2)  # asha: the best 1 / reduction_factor go on at each rung


class SweepConfig(BaseModel, frozen=True, extra="forbid"):
    seeds: list[int] | None = Field(None, min_length=1)  # the job's seed; None: the job's own
    # dotted key -> its values, or {name: value} to name them (a section's values, say)
    grid: dict[str, list[Any] | dict[str, Any]] = Field(default_factory=dict)
    random: RandomAxes | None = None
    seed: int = Field(0, ge=0)  # the random axes' draws are a pure function of it
    max_cells: int = Field(DEFAULT_MAX_CELLS, ge=1)  # more cells need --confirm-cells
    stopping: StoppingConfig | None = None

    @property
    def axis_keys(self) -> list[str]:
        """The grid's keys, then the random axes' keys, as written."""
        return [*self.grid, *(self.random.axes if self.random is not None else {})]

    def points(self, key: str) -> list[tuple[str | None, Any]]:
        """A grid axis's (name, value) pairs; the name is None for a listed value."""
        values = self.grid[key]
        return list(values.items()) if isinstance(values, dict) else [(None, v) for v in values]

    def identity(self) -> dict[str, Any]:
        """What decides the cells and what they compute (not the limit, nor the stopping rule)."""
        return self.model_dump(mode="json", include={"seeds", "grid", "random", "seed"})


@dataclass(frozen=True)
class Cell:
    """One simulation of a sweep."""

    variant: str
    seed: int
    grid: tuple[tuple[str, Any], ...] = ()  # (dotted key, value) for each grid axis
    drawn: tuple[tuple[str, Any], ...] = ()  # (dotted key, value) for each random axis
    sample: int | None = None  # the random sample's index; None without random axes
    names: tuple[tuple[str, str], ...] = ()  # (dotted key, name) for each grid axis of named values

    @property
    def axes(self) -> tuple[tuple[str, Any], ...]:
        return self.grid + self.drawn

    @property
    def name(self) -> str:
        """The cell's name, fit for a run folder: ``fedavg_lr0.01_seed1`` (``_r2``: random sample 2)."""
        parts = [self.variant, *(f"{_short(k, self.axes)}{_slug(self.shown(k, v))}" for k, v in self.grid)]
        if self.sample is not None:
            parts.append(f"r{self.sample}")
        return "_".join([*parts, f"seed{self.seed}"])

    @property
    def label(self) -> str:
        """Readable axes: ``fedavg lr=0.01 mu=0.0123 seed=1``."""
        axes = [f"{_short(k, self.axes)}={self.shown(k, v)}" for k, v in self.axes]
        return " ".join([self.variant, *axes, f"seed={self.seed}"])

    def shown(self, key: str, value: Any) -> str:
        """An axis value as text: its name when the grid names its values."""
        return dict(self.names).get(key) or _show(value)

    def value(self, key: str) -> Any:
        """The cell's value on an axis (``variant`` and ``seed`` included)."""
        if key == "variant":
            return self.variant
        if key == "seed":
            return self.seed
        return dict(self.axes)[key]

    def tags(self, sweep: str) -> dict[str, str]:
        """The cell run's tags (the tag contract above)."""
        axes = {"variant": self.variant, "seed": self.seed, **dict(self.axes), **dict(self.names)}
        return {SWEEP_TAG: sweep, CELL_TAG: self.name, **{AXIS_TAG + k: str(v) for k, v in axes.items()}}

    def overrides(self) -> list[str]:
        """``key=value`` overrides that make the variant's job this cell's."""
        return [f"{key}={as_yaml(value)}" for key, value in self.axes] + [f"seed={self.seed}"]


def _short(key: str, axes: tuple[tuple[str, Any], ...]) -> str:
    """An axis key's last part (``lr``), or the whole key when another axis ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k, _ in axes) == 1 else key


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", _show(value)) or "x"


def as_yaml(value: Any) -> str:
    """A value as one line of YAML that reads back as the same value (``1.0e-05``, ``[1, 2]``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def parse_sweep(raw: Any, source: str | None = None) -> SweepConfig:
    """Validates a ``sweep:`` mapping; every problem in one ConfigError, keys under ``sweep.``."""
    if not isinstance(raw, dict):
        raise ConfigError(
            ["sweep: must be a mapping (seeds, grid, random, seed, max_cells, stopping)"], source
        )
    try:
        spec = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(explain(exc, SweepConfig, prefix="sweep."), source) from None
    problems = [
        f"sweep.grid.{key}: an empty axis; give it at least one value, or remove it"
        for key, values in spec.grid.items()
        if not values
    ]
    if spec.random is not None:
        problems += [
            f"sweep.random.axes.{key}: also a grid axis; keep it in one"
            for key in spec.random.axes
            if key in spec.grid
        ]
    problems += [
        f"sweep.grid.{key}: sweep seeds with sweep.seeds: [0, 1, 2]"
        for key in spec.axis_keys
        if key == "seed"
    ]
    if spec.seeds is not None and len(set(spec.seeds)) < len(spec.seeds):
        problems.append(f"sweep.seeds: a seed is listed twice ({spec.seeds}); list each once")
    if problems:
        raise ConfigError(problems, source)
    return spec


def draw_samples(spec: SweepConfig) -> list[tuple[tuple[str, Any], ...]]:
    """The random axes' joint draws: a pure function of ``spec.seed`` (empty without them)."""
    if spec.random is None:
        return []
    rng = np.random.default_rng(spec.seed)
    return [
        tuple((key, dist.draw(rng)) for key, dist in spec.random.axes.items())
        for _ in range(spec.random.samples)
    ]


def expand_cells(spec: SweepConfig, variants: dict[str, int]) -> list[Cell]:
    """Every cell: variants x grid points x random samples x seeds, the seed varying fastest.
    ``variants`` maps each variant's name to its job's seed (the seed without ``sweep.seeds``)."""
    grid_points = list(itertools.product(*([(k, *p) for p in spec.points(k)] for k in spec.grid)))
    samples: list[tuple[int | None, tuple[tuple[str, Any], ...]]] = list(enumerate(draw_samples(spec)))
    return [
        Cell(
            variant,
            seed,
            tuple((k, v) for k, _, v in point),
            drawn,
            sample,
            tuple((k, name) for k, name, _ in point if name is not None),
        )
        for variant, job_seed in variants.items()
        for point, (sample, drawn) in itertools.product(grid_points, samples or [(None, ())])
        for seed in spec.seeds or [job_seed]
    ]


def sweep_id(job_name: str, spec: SweepConfig, base: dict[str, Any]) -> str:
    """A stable id: the job's name plus a short hash of the sweep's axes and the base job
    (the file without its sweep section, overrides applied): the same sweep resumes under it."""
    text = json.dumps([spec.identity(), base], sort_keys=True, default=str)
    return f"{job_name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def parse_only(texts: list[str], spec: SweepConfig) -> list[dict[str, str]]:
    """``--only variant=fedavg,seed=1`` filters: one mapping per flag (a cell passes one of them
    when it has every value of it). Keys: variant, seed and the sweep's axis keys."""
    valid = [*FILTER_KEYS, *spec.axis_keys]
    filters, problems = [], []
    for text in texts:
        wanted: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep or not key:
                problems.append(
                    f"--only {text!r}: expected key=value[,key=value], e.g. variant=fedavg,seed=1"
                )
            elif key not in valid:
                close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(f"--only {key}: not an axis of this sweep{hint} (axes: {', '.join(valid)})")
            else:
                wanted[key] = value
        filters.append(wanted)
    if problems:
        raise ConfigError(problems)
    return filters


def matches(cell: Cell, wanted: dict[str, str]) -> bool:
    """The cell has every value ``wanted`` names (compared as YAML values, else as text)."""
    for key, text in wanted.items():
        value = cell.value(key)
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            parsed = text
        if parsed != value and text not in (str(value), _show(value), dict(cell.names).get(key)):
            return False
    return True


def select(cells: list[Cell], filters: list[dict[str, str]]) -> list[Cell]:
    """The cells that pass any one of the filters (all cells without filters)."""
    return [c for c in cells if not filters or any(matches(c, f) for f in filters)]
