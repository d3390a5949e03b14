"""Central DP on the driver: each round's clip bound out, the merged sums noised and released, and the
epsilon spent so far (docs/privacy.md).

The workers clip (``raysim.private_sums.ClippedSums``); the ledger does the rest, once a round, in
this order: noise on every summed coordinate (independent, or DP-FTRL's correlated noise), the
aggregate over the fixed denominator, the clip bound's adaptive step from the noised count, and the
accountant's epsilon after the rounds released. Its state (rounds released, the bound, the
correlated noise's history) is part of every checkpoint, so a resumed run never restarts its
accountant.

Usage:
    ledger = PrivacyLedger.of(job, population=len(pool), weights=store.num_examples("train")[pool])
    options = RoundOptions(privacy=ledger.round_options())
    aggregate = ledger.release(aggregator_of(algorithm), output.aggregate, round_num)
    ledger.metrics()  # privacy/epsilon, privacy/noise_multiplier, privacy/clip_bound
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from raysim.aggregate import Aggregator, Partial
from raysim.config import JobConfig
from raysim.config.privacy import CentralPrivacy
from raysim.errors import ConfigError
from raysim.privacy.banded_noise import band_coefficients, correlated, kept
from raysim.privacy.spending import Spending
from raysim.private_sums import (
    PrivatePartial,
    PrivateRound,
    Summing,
    add_noise,
    client_weight,
    gaussian_draws,
    map_tensors,
    released,
)
from raysim.sampling import noise_seed
from raysim.types import Metrics


@dataclass
class PrivacyLedger:
    """The driver's central DP: settings fixed at build, and what changes by round."""

    config: CentralPrivacy
    spending: Spending  # what each round spends, and the epsilon after r rounds
    denominator: float  # the expected total weight: what the sums divide by
    expected_cohort: float  # the count's denominator (adaptive clipping)
    seed: int
    clip_bound: float  # this round's: it adapts between rounds
    rounds: int = 0  # rounds released so far (a resumed run's count goes on)
    history: list[list[torch.Tensor]] = field(default_factory=list)  # the correlated noise's last draws
    shape: Partial | None = None  # zeroed sums of the last round: the noise of an empty cohort
    rounds_allowed: int | None = None  # fewer than the job's where the budget stops the run
    last: Metrics = field(default_factory=dict)

    @classmethod
    def of(
        cls, job: JobConfig, spending: Spending, examples: np.ndarray, rounds_allowed: int | None = None
    ) -> PrivacyLedger:
        """A fresh ledger; ``examples`` each training client's (the capped weights' denominator is
        the expected cohort's total weight)."""
        central = job.privacy.central if job.privacy is not None else None
        assert central is not None  # built only for a job with central DP
        cohort = float(job.engine.cohort_size)
        mean_weight = float(np.mean([client_weight(n, central.weight_cap) for n in examples]))
        return cls(
            central,
            spending,
            cohort * mean_weight,
            cohort,
            job.seed,
            central.clip_bound,
            rounds_allowed=rounds_allowed,
        )

    @property
    def bands(self) -> int | None:
        """DP-FTRL's bands (its sampler draws from one group of clients a round); None: fresh noise."""
        return self.config.bands if self.config.noise == "banded" else None

    # --- the round --------------------------------------------------------------------------------

    def round_options(self) -> PrivateRound:
        """What the workers need: this round's bound, and the weights' cap."""
        return PrivateRound(self.clip_bound, self.config.weight_cap)

    def release(self, aggregator: Aggregator[Any], partial: object, round_num: int) -> Any:
        """The round's aggregate, as the plugin's server step receives it: the merged sums noised
        and divided by the fixed denominator; then the bound's adaptive step and the accounting."""
        if not isinstance(aggregator, Summing) or not isinstance(partial, PrivatePartial):
            raise TypeError(f"central DP releases clipped sums, not {type(partial).__name__}")
        sums = self._sums_of(partial, round_num)
        generator = torch.Generator().manual_seed(noise_seed(self.seed, round_num))
        std = self.spending.sum_noise_multiplier * self.clip_bound
        fresh = [std * draw for draw in gaussian_draws(sums, generator)]
        noise = fresh
        if self.config.noise == "banded":
            coefficients = band_coefficients(self.config.bands)
            noise = correlated(fresh, self.history, coefficients)
            self.history = kept(self.history, noise, self.config.bands)
        aggregate = released(aggregator, add_noise(sums, noise), self.denominator)
        bound = self.clip_bound
        if self.config.adaptive is not None:
            self.clip_bound = self._adapted(partial.within_bound, generator)
        self.rounds += 1
        self.last = {
            "privacy/epsilon": self.spending.epsilon(self.rounds),
            "privacy/noise_multiplier": self.spending.noise_multiplier,
            "privacy/clip_bound": bound,
            "privacy/cohort": float(partial.clients),
        }
        return aggregate

    def _sums_of(self, partial: PrivatePartial, round_num: int) -> Partial:
        """The round's sums; for an empty cohort (Poisson sampling), zeros shaped as the last
        round's, so the noise is released all the same (a skipped release would tell)."""
        if partial.clients:
            self.shape = map_tensors(torch.zeros_like, partial.sums)
            return partial.sums
        if self.shape is None:
            raise ConfigError(
                [
                    f"engine.sampling: round {round_num} drew no client before any round showed the "
                    f"shape of the sums to noise; raise engine.cohort_size (the expected cohort)"
                ]
            )
        return self.shape

    def _adapted(self, within_bound: int, generator: torch.Generator) -> float:
        """Andrew et al.'s geometric step: ``C * exp(-eta * (b - gamma))``, ``b`` the noised
        fraction of clients whose contribution was within the bound."""
        adaptive = self.config.adaptive
        assert adaptive is not None
        noisy = within_bound + self.spending.count_stddev * float(
            torch.randn((), generator=generator, dtype=torch.float64)
        )
        fraction = noisy / self.expected_cohort
        return self.clip_bound * math.exp(-adaptive.learning_rate * (fraction - adaptive.target_quantile))

    def metrics(self) -> Metrics:
        """The latest release's ``privacy/*`` metrics."""
        return dict(self.last)

    # --- the checkpoint ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: rounds released, the bound, the correlated noise's history."""
        return {
            "rounds": self.rounds,
            "clip_bound": self.clip_bound,
            "noise_multiplier": self.spending.noise_multiplier,
            "history": [[t.clone() for t in draws] for draws in self.history],
        }

    def restore(self, saved: dict[str, Any], path: str) -> None:
        """A resumed run's accountant goes on from the checkpoint's rounds."""
        try:
            rounds, bound, z = (
                int(saved["rounds"]),
                float(saved["clip_bound"]),
                float(saved["noise_multiplier"]),
            )
            history = [[torch.as_tensor(t) for t in draws] for draws in saved["history"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                [f"{path}: its privacy ledger is unreadable ({exc!r}); resume from another checkpoint"]
            )
        if not (rounds >= 0 and math.isfinite(bound) and bound > 0):
            raise ConfigError([f"{path}: its privacy ledger holds rounds {rounds}, clip bound {bound}"])
        if not math.isclose(z, self.spending.noise_multiplier, rel_tol=1e-9):
            raise ConfigError(
                [
                    f"{path}: its run's noise multiplier was {z:.6g}, this job's is "
                    f"{self.spending.noise_multiplier:.6g}; a run cannot change its noise midway "
                    f"(set privacy.central.noise_multiplier: {z:.6g})"
                ]
            )
        self.rounds, self.clip_bound, self.history = rounds, bound, history
