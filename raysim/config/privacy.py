"""The job's ``privacy:`` section: differential privacy, where it acts, what it may spend (docs/privacy.md).

Three places a mechanism can act, each its own subsection, any of them together:

- ``central``: user-level DP on the server's sum (DP-FedAvg, McMahan et al., ICLR 2018,
  arXiv:1710.06963): each client's contribution clipped to ``clip_bound``, Gaussian noise of
  standard deviation ``noise_multiplier * clip_bound`` added once to the sum, which is divided by a
  fixed denominator. The noise is given, or calibrated from ``target_epsilon``; the bound may adapt
  to a quantile of the clients' norms (Andrew et al., NeurIPS 2021, arXiv:1905.03871); the noise may
  be correlated across rounds (DP-FTRL with banded matrix factorization, Choquette-Choo et al.,
  NeurIPS 2023, arXiv:2306.08153).
- ``local``: each client's update clipped and noised on its device, before anything leaves it.
- ``sample``: DP-SGD inside each client (Abadi et al., CCS 2016, arXiv:1607.00133): every
  example's gradient clipped, Gaussian noise on each batch's sum.

Usage:
    privacy:
      central: {clip_bound: 0.5, target_epsilon: 4.0}
      delta: 1.0e-5
      budget: {epsilon: 8.0, when_reached: stop}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator


class AdaptiveClipping(BaseModel, frozen=True, extra="forbid"):
    """The clip bound follows a quantile of the clients' update norms (Andrew et al. 2021, Alg. 1):
    ``C <- C * exp(-learning_rate * (b - target_quantile))``, ``b`` the noised fraction of the
    cohort whose norm was at most ``C``. The count's noise is accounted: the update's noise
    multiplier is lowered so that the pair spends what ``noise_multiplier`` alone would."""

    target_quantile: float = Field(0.5, gt=0, lt=1)
    learning_rate: float = Field(0.2, gt=0, allow_inf_nan=False)  # their eta_C, geometric update
    # the count's noise std, in clients; None: the expected cohort over 20, the paper's choice
    count_stddev: float | None = Field(None, gt=0, allow_inf_nan=False)


class CentralPrivacy(BaseModel, frozen=True, extra="forbid"):
    """User-level DP on the server's sum of client contributions (DP-FedAvg)."""

    clip_bound: float = Field(gt=0, allow_inf_nan=False)  # L2, over the whole contribution
    noise_multiplier: float | None = Field(None, ge=0, allow_inf_nan=False)  # noise std / clip_bound
    target_epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)  # or: calibrate the noise
    # None: every client weighs 1; else min(examples / weight_cap, 1) (McMahan et al.'s capped
    # w_k = min(n_k / w_hat, 1)), which keeps each contribution within the bound
    weight_cap: int | None = Field(None, ge=1)
    adaptive: AdaptiveClipping | None = None
    # 1: fresh noise each round; b >= 2: DP-FTRL's noise correlated over b rounds (banded matrix
    # factorization), the clients drawn from one of b groups a round (needs engine.sampling: poisson)
    bands: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _one_noise_source(self) -> CentralPrivacy:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(
                "set exactly one of noise_multiplier (the noise std over clip_bound) and "
                "target_epsilon (the noise calibrated to reach it at privacy.delta after the run's rounds)"
            )
        if self.adaptive is not None and self.bands > 1:
            raise ValueError("adaptive clipping is accounted for fresh noise only: set bands: 1")
        return self


class LocalPrivacy(BaseModel, frozen=True, extra="forbid"):
    """Each client's update clipped and noised before it leaves the device: per report,
    ``gaussian`` is (epsilon, delta)-DP (L2 clip), ``laplace`` is (2 / noise_multiplier)-DP (L1 clip:
    any two clipped updates differ by up to twice the bound; ``raysim.privacy.per_client``)."""

    mechanism: Literal["gaussian", "laplace"] = "gaussian"
    clip_bound: float = Field(gt=0, allow_inf_nan=False)  # L2 for gaussian, L1 for laplace
    # the noise's std (gaussian) or scale (laplace) over the clip bound
    noise_multiplier: float = Field(gt=0, allow_inf_nan=False)


class SamplePrivacy(BaseModel, frozen=True, extra="forbid"):
    """DP-SGD in local training: each example's gradient clipped to ``clip_bound`` (L2, over the
    trainable parameters), Gaussian noise ``noise_multiplier * clip_bound`` on each batch's sum."""

    clip_bound: float = Field(gt=0, allow_inf_nan=False)
    noise_multiplier: float = Field(gt=0, allow_inf_nan=False)


class PrivacyBudget(BaseModel, frozen=True, extra="forbid"):
    """The most central epsilon a run may spend: ``refuse`` a run whose rounds would exceed it before it
    starts, or ``stop`` it after the last round that stays within it (it ends FINISHED, saying so)."""

    epsilon: float = Field(gt=0, allow_inf_nan=False)
    when_reached: Literal["refuse", "stop"] = "refuse"


class PrivacyConfig(BaseModel, frozen=True, extra="forbid"):
    """Differential privacy: central (user-level), local, sample-level (DP-SGD); ``delta`` and the
    accountant shared by all three."""

    central: CentralPrivacy | None = None
    local: LocalPrivacy | None = None
    sample: SamplePrivacy | None = None
    # the guarantee's delta; must be below 1 / population (the run checks it against the data)
    delta: float | None = Field(None, gt=0, lt=1)
    # dp-accounting's RDP or PLD, or prv-accountant's PRV (tighter for a large population sampled
    # at a small rate: Poisson sampling only, ACCOUNTED_SAMPLINGS)
    accountant: Literal["rdp", "pld", "prv"] = "rdp"
    budget: PrivacyBudget | None = None

    @model_validator(mode="after")
    def _something_private(self) -> PrivacyConfig:
        if self.central is None and self.local is None and self.sample is None:
            raise ValueError("names no mechanism: set central, local or sample (docs/privacy.md)")
        gaussian = (
            self.central is not None
            or self.sample is not None
            or (self.local is not None and self.local.mechanism == "gaussian")
        )
        if gaussian and self.delta is None:
            raise ValueError(
                "delta: required by a Gaussian mechanism; set it below 1 / population, e.g. 1.0e-5"
            )
        if self.budget is not None and self.central is None:
            raise ValueError(
                "budget: bounds central DP's epsilon (a client's local and sample-level epsilon are "
                "logged, not budgeted); set central, or remove budget"
            )
        if self.central is not None and self.central.target_epsilon is not None and self.budget is not None:
            if self.central.target_epsilon > self.budget.epsilon:
                raise ValueError(
                    f"central.target_epsilon {self.central.target_epsilon} exceeds budget.epsilon "
                    f"{self.budget.epsilon}: lower the target or raise the budget"
                )
        return self


# The samplings each accountant can account: dp-accounting's PLD accountant has no branch for
# sampling without replacement, and prv-accountant models Poisson-sampled Gaussians only.
ACCOUNTED_SAMPLINGS = {"rdp": ("poisson", "fixed"), "pld": ("poisson",), "prv": ("poisson",)}


def accountant_problem(accountant: str, sampling: str) -> str | None:
    """Why ``accountant`` cannot account ``sampling`` (with the fix); None: it can."""
    if sampling in ACCOUNTED_SAMPLINGS[accountant]:
        return None
    return (
        f"the {accountant} accountant cannot account {sampling}-size sampling without replacement "
        f"(it handles Poisson sampling only): use accountant: rdp, or engine.sampling: poisson"
    )


def sampling_problems(
    privacy: PrivacyConfig | None, sampling: str, schedule: str | None, has_system: bool
) -> list[str]:
    """The job's sampling against its privacy, before anything is built (so ``--dry-run`` and a
    sweep's cells report them): what picks the cohorts must be what the accountant assumes."""
    problems = []
    pickers = [
        key for key, set_ in (("engine.schedule", schedule is not None), ("system", has_system)) if set_
    ]
    if sampling == "poisson":
        problems += [
            f"engine.sampling: poisson draws each round's cohort itself; unset {key}" for key in pickers
        ]
    central = privacy.central if privacy is not None else None
    if central is None:
        return problems
    if sampling == "fixed":
        problems += [
            f"privacy.central: {key} picks the cohorts, which the accountant's amplification by sampling "
            f"cannot trust; unset it (engine.sampling picks them at random)"
            for key in pickers
        ]
    if central.bands > 1 and sampling != "poisson":
        problems.append(
            "privacy.central.bands: DP-FTRL's noise is accounted for Poisson sampling over the bands' "
            "client groups; set engine.sampling: poisson"
        )
    assert privacy is not None
    if (problem := accountant_problem(privacy.accountant, sampling)) is not None:
        problems.append(f"privacy.accountant: {problem}")
    return problems
