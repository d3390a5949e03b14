"""The job's ``robust:`` and ``attack:`` sections: a Byzantine-robust aggregation rule in place of a
plugin's weighted mean, and malicious clients to test it against (docs/robustness.md).

``robust`` names one rule (``rule:``), each with its own options; ``attack`` names one attack
(``kind:``) and the ``fraction`` of the training clients that run it (chosen by the seed,
``raysim.robust.attacks.malicious_clients``). The checks that need the job's other sections
(the cohort against Krum's f, a plugin without a weighted mean, central DP) are ``robust_problems``.

Usage:
    robust: {rule: multi_krum, f: 2, m: 5}               # device: auto, memory_mb: None (every rule)
    attack: {kind: sign_flip, fraction: 0.3}
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from raysim.aggregate import WeightedMean
from raysim.config.sections import EngineConfig

FLOAT_SLACK = 1e-9  # beta * n a hair below an integer by float error (0.29 * 100) still reaches it


def trimmed_count(beta: float, n: int) -> int:
    """``floor(beta * n)``, the values a trimmed mean drops from each side of ``n``, robust to
    float error (``int(0.29 * 100)`` is 28)."""
    return math.floor(beta * n + FLOAT_SLACK)


class RuleSettings(BaseModel, frozen=True, extra="forbid"):
    """Where every rule runs on the driver (``raysim.robust.placement``): ``auto`` on the GPU the
    workers train on where the driver sees it, else its CPU; ``memory_mb`` bounds the release's
    memory there, the ``n x d`` float32 rows included (None: 80% of the card's free memory on a
    GPU, the rows and 96 MiB of column chunks on the CPU)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    memory_mb: float | None = Field(None, gt=0, allow_inf_nan=False)


class Median(RuleSettings, frozen=True, extra="forbid"):
    """Coordinate-wise median (Yin et al., ICML 2018, arXiv:1803.01498): the middle value of each
    coordinate, the mean of the two middle ones for an even count."""

    rule: Literal["median"]


class TrimmedMean(RuleSettings, frozen=True, extra="forbid"):
    """Coordinate-wise trimmed mean (Yin et al. 2018): each coordinate's ``floor(beta * n)`` largest
    and smallest values dropped, the rest averaged."""

    rule: Literal["trimmed_mean"]
    beta: float = Field(0.1, ge=0, le=0.5)  # trimmed from each side (1/2 of an odd n: the median)


class Krum(RuleSettings, frozen=True, extra="forbid"):
    """Krum (Blanchard et al., NeurIPS 2017): the update whose ``n - f - 2`` nearest others are
    nearest (sum of squared distances); needs ``n > 2f + 2``."""

    rule: Literal["krum"]
    f: int = Field(ge=0)  # Byzantine clients tolerated per round


class MultiKrum(RuleSettings, frozen=True, extra="forbid"):
    """Multi-Krum (Blanchard et al. 2017): the mean of the ``m`` updates of best Krum score."""

    rule: Literal["multi_krum"]
    f: int = Field(ge=0)
    m: int | None = Field(None, ge=1)  # None: n - f, the paper's choice


class GeometricMedian(RuleSettings, frozen=True, extra="forbid"):
    """RFA's geometric median (Pillutla et al., IEEE TSP 2022, arXiv:1912.13445): smoothed Weiszfeld
    iterations, distances floored at ``nu``, from the weighted mean, until the weighted sum of
    distances changes by at most ``tol`` of itself or after ``max_iterations``."""

    rule: Literal["geometric_median"]
    nu: float = Field(1e-6, gt=0, allow_inf_nan=False)
    max_iterations: int = Field(100, ge=1)
    tol: float = Field(1e-6, ge=0, allow_inf_nan=False)


class NormBound(RuleSettings, frozen=True, extra="forbid"):
    """Norm bounding (Sun et al. 2019, arXiv:1911.07963): each update scaled to L2 norm at most
    ``max_norm``, then the weighted mean."""

    rule: Literal["norm_bound"]
    max_norm: float = Field(gt=0, allow_inf_nan=False)


class CenteredClip(RuleSettings, frozen=True, extra="forbid"):
    """Centered clipping (Karimireddy et al., ICML 2021, arXiv:2012.10333):
    ``v <- v + mean_i clip(x_i - v, tau)`` ``iterations`` times, from the previous round's
    aggregate (the paper's momentum start; zero in round 0; a resume is refused) or from ``zero``."""

    rule: Literal["centered_clip"]
    tau: float = Field(gt=0, allow_inf_nan=False)
    iterations: int = Field(1, ge=1)  # the paper's L
    start: Literal["previous", "zero"] = "previous"


RobustConfig = Annotated[
    Median | TrimmedMean | Krum | MultiKrum | GeometricMedian | NormBound | CenteredClip,
    Field(discriminator="rule"),
]
RULES = ("median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "norm_bound", "centered_clip")


class SignFlip(BaseModel, frozen=True, extra="forbid"):
    """A malicious client sends ``-scale * update``."""

    kind: Literal["sign_flip"]
    fraction: float = Field(ge=0, lt=1)  # of the training clients, chosen by the seed
    scale: float = Field(1.0, gt=0, allow_inf_nan=False)


class Scale(BaseModel, frozen=True, extra="forbid"):
    """Model replacement (Bagdasaryan et al., AISTATS 2020): a malicious client sends
    ``boost * update`` (boost ~ cohort size / malicious count replaces the model)."""

    kind: Literal["scale"]
    fraction: float = Field(ge=0, lt=1)
    boost: float = Field(10.0, gt=0, allow_inf_nan=False)


class Gaussian(BaseModel, frozen=True, extra="forbid"):
    """A malicious client sends ``N(0, sigma^2)`` noise in place of its update."""

    kind: Literal["gaussian"]
    fraction: float = Field(ge=0, lt=1)
    sigma: float = Field(1.0, gt=0, allow_inf_nan=False)


class LabelFlip(BaseModel, frozen=True, extra="forbid"):
    """Data poisoning: a malicious client trains on labels ``y -> C - 1 - y``, or ``mapping``'s
    (source -> target; labels not in it kept)."""

    kind: Literal["label_flip"]
    fraction: float = Field(ge=0, lt=1)
    mapping: dict[int, int] | None = None


class ALIE(BaseModel, frozen=True, extra="forbid"):
    """ "A little is enough" (Baruch et al., NeurIPS 2019): the malicious clients send the benign
    updates' coordinate-wise ``mean - z * std``; ``z`` from the paper's formula unless given."""

    kind: Literal["alie"]
    fraction: float = Field(ge=0, lt=1)
    z: float | None = Field(None, allow_inf_nan=False)


AttackConfig = Annotated[SignFlip | Scale | Gaussian | LabelFlip | ALIE, Field(discriminator="kind")]
UPDATE_ATTACKS = ("sign_flip", "scale", "gaussian")  # applied on the malicious client's worker


def gathers_updates(robust: object | None, attack: object | None) -> bool:
    """Whether a round keeps every client's update (a robust rule, or ALIE, which reads the benign
    updates of the round) instead of summing them."""
    return robust is not None or getattr(attack, "kind", None) == "alie"


def robust_problems(
    robust: RobustConfig | None,
    attack: AttackConfig | None,
    engine: EngineConfig,
    central_privacy: bool,
    algorithm: tuple[str, object] | None,
) -> list[str]:
    """The ``robust`` and ``attack`` sections against the rest of the job, one line each: the
    cohort (``engine.cohort_size``, the expected one under Poisson sampling) against the rule,
    central DP, the plugin's aggregator (``algorithm``: its name and built plugin), vectorizing."""
    # asynchronous FedBuff's rule reads a buffer, not a cohort: raysim.engine.async_setup checks it
    sync = engine.asynchrony is None
    problems = cohort_problems(robust, engine.cohort_size) if robust is not None and sync else []
    if robust is not None and central_privacy:
        problems.append(
            "robust: a robust rule reads every update, central DP releases only their noised sum; "
            "remove robust or privacy.central"
        )
    if attack is not None and attack.kind == "label_flip" and engine.vectorize == "on":
        problems.append(
            "attack: label_flip changes the malicious clients' batches, which a vectorized round "
            "trains as stored; set engine.vectorize to auto or off"
        )
    model_attack = attack is not None and attack.kind != "label_flip"
    if algorithm is not None and (robust is not None or model_attack):
        name, plugin = algorithm
        hook = getattr(plugin, "aggregator", None)
        aggregator = hook() if callable(hook) else None
        if not isinstance(aggregator, WeightedMean):
            what = "robust" if robust is not None else "attack"
            kind = type(aggregator).__name__ if aggregator is not None else "Gather (a staged protocol)"
            problems.append(
                f"{what}: algorithm {name!r} aggregates with {kind}, not a WeightedMean of updates, "
                f"which robust rules and update attacks replace; use a FedAvg-family plugin"
            )
    return problems


def cohort_problems(
    robust: RobustConfig, n: int, cohort: str = "cohort", knob: str = "engine.cohort_size"
) -> list[str]:
    """The rule against the ``n`` updates it reads at once: a round's ``cohort``, or FedBuff's
    buffer (``cohort="buffer"``, ``knob`` its buffer_size); one line each, naming ``knob``."""
    if isinstance(robust, Krum | MultiKrum) and n <= 2 * robust.f + 2:
        return [
            f"robust.f: {robust.rule} needs a {cohort} of more than 2f + 2 = {2 * robust.f + 2} "
            f"updates, {knob} is {n}; lower f to at most {max((n - 3) // 2, 0)} or raise {knob}"
        ]
    if isinstance(robust, MultiKrum) and robust.m is not None and robust.m > n:
        return [f"robust.m: averages the m best of the {cohort}'s {n} updates; choose m in 1..{n}"]
    if isinstance(robust, TrimmedMean) and n - 2 * trimmed_count(robust.beta, n) < 1:
        return [
            f"robust.beta: trimming {robust.beta} of {n} from each side leaves no update of the "
            f"{cohort}; lower beta or raise {knob}"
        ]
    return []
