"""``engine.selection``: how each round's clients are chosen from the candidates (docs/systems.md,
"Client selection"); ``raysim.selection`` implements each kind."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from raysim.aggregate import WeightedMean


class UniformSelection(BaseModel, frozen=True, extra="forbid"):
    """Uniformly without replacement (what a job without ``engine.selection`` does)."""

    kind: Literal["uniform"] = "uniform"


class OortSelection(BaseModel, frozen=True, extra="forbid"):
    """Oort's guided participant selection (Lai et al., OSDI 2021, Algorithm 1;
    ``raysim.selection.oort``): the defaults are the paper's."""

    kind: Literal["oort"] = "oort"
    epsilon: float = Field(0.9, ge=0, le=1)  # the share of the cohort explored in round 0
    epsilon_min: float = Field(0.2, ge=0, le=1)  # ... decaying to this floor
    epsilon_decay: float = Field(0.98, gt=0, le=1)  # ... by this factor a round
    alpha: float = Field(2.0, ge=0)  # the penalty's exponent on a client slower than T
    cutoff: float = Field(0.95, gt=0, le=1)  # c: exploit among clients above c x the cut-off's utility
    clip_quantile: float = Field(0.95, gt=0, le=1)  # utilities clipped at the sorted one at int(this * n)
    window: int = Field(20, ge=1)  # W: the pacer compares the utility of the last W rounds' and the W before
    round_s: float | None = Field(None, gt=0)  # T, the preferred round duration; None: measured
    pacer_step_s: float | None = Field(None, gt=0)  # what the pacer adds to T; None: T's start / 10

    @model_validator(mode="after")
    def _floor_below_start(self) -> OortSelection:
        if self.epsilon_min > self.epsilon:
            raise ValueError(f"epsilon_min {self.epsilon_min} is above epsilon {self.epsilon}; lower it")
        return self


class PowerOfChoiceSelection(BaseModel, frozen=True, extra="forbid"):
    """Power-of-choice, computation-free (rpow-d: Cho, Wang and Joshi, 2020,
    ``raysim.selection.power_of_choice``): ``d`` candidates drawn by data size, the cohort those
    with the highest loss reported when they last trained (never-seen clients first)."""

    kind: Literal["power_of_choice"] = "power_of_choice"
    d: int | None = Field(None, ge=1)  # candidates a round, at least the cohort; None: twice the cohort


SelectionConfig = Annotated[
    UniformSelection | OortSelection | PowerOfChoiceSelection, Field(discriminator="kind")
]


def selection_problems(
    selection: SelectionConfig | None,
    cohort_size: int,
    sampling: str,
    schedule: str | None,
    central_dp: bool,
    algorithm: tuple[str, object] | None = None,
) -> list[str]:
    """A guided selection against the rest of the job, before anything is built: each of these
    picks the cohort itself, or assumes it is picked at random. ``algorithm``: the algorithm
    section's name and built plugin (None: not checked)."""
    if selection is None or selection.kind == "uniform":
        return []
    key = f"engine.selection: {selection.kind}"
    problems = []
    if central_dp:
        problems.append(
            f"{key} picks clients by their losses, and privacy.central's accountant assumes uniform or "
            f"Poisson sampling; use engine.selection: {{kind: uniform}}"
        )
    if sampling == "poisson":
        problems.append(f"{key} draws a fixed-size cohort; set engine.sampling: fixed")
    if schedule is not None:
        problems.append(f"{key} picks each round's cohort, and engine.schedule fixes them; unset one")
    d = getattr(selection, "d", None)
    if d is not None and d < cohort_size:
        problems.append(f"{key}: d {d} is below engine.cohort_size {cohort_size}; raise d")
    if selection.kind == "power_of_choice" and algorithm is not None and weighted_by_examples(algorithm[1]):
        problems.append(
            f"{key} draws candidates in proportion to their data size, and algorithm {algorithm[0]!r} "
            f"weights their updates by examples again (Cho et al. average them uniformly); set "
            f"algorithm.weighted: false"
        )
    return problems


def weighted_by_examples(plugin: object) -> bool:
    """Whether the plugin's aggregate weights the updates by examples: a weighted ``WeightedMean``,
    or a ``weighted: true`` option (SCAFFOLD's, FedGMA's own sums). A plugin with neither (FedNova's
    ``p_i``) is not known to."""
    hook = getattr(plugin, "aggregator", None)
    aggregator = hook() if callable(hook) else None
    if isinstance(aggregator, WeightedMean):
        return aggregator.weighted
    return getattr(getattr(plugin, "config", None), "weighted", None) is True
