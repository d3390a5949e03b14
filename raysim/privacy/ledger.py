"""Central DP on the driver: each round's clip bound out, the merged sums noised and released, and the
epsilon spent so far (docs/privacy.md).

The workers clip (``raysim.private_sums.ClippedSums``); the ledger does the rest, once a round, in
this order: noise on every summed coordinate (fresh, or DP-FTRL's correlated noise), the aggregate
over the fixed denominator, the clip bound's adaptive step from the noised count, and the
accountant's epsilon after the rounds released. What changes by round (``LedgerState``: rounds
released, the bound, the correlated noise's history) is part of every checkpoint, so a resumed run
never restarts its accountant.

Usage:
    ledger = PrivacyLedger.of(job, spending, examples=store.num_examples("train")[pool], pool_size=len(pool))
    options = RoundOptions(clipping=ledger.clipping())
    aggregate = ledger.release(aggregator_of(algorithm), output.aggregate, round_num)
    ledger.metrics()  # privacy/epsilon, privacy/noise_multiplier, privacy/clip_bound
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from raysim.aggregate import Aggregator, Partial, Summing
from raysim.config import JobConfig
from raysim.config.job import noise_salt
from raysim.config.privacy import CentralPrivacy
from raysim.errors import CheckpointError, ConfigError
from raysim.privacy.banded_noise import band_coefficients, correlated, kept
from raysim.privacy.spending import Spending
from raysim.private_sums import (
    ClientClipping,
    PrivatePartial,
    add_noise,
    client_weight,
    gaussian_draws,
    map_tensors,
    released,
)
from raysim.sampling import cyclic_groups, noise_seed
from raysim.stored import from_plain
from raysim.types import Metrics


@dataclass(frozen=True)
class LedgerState:
    """What central DP carries from round to round, and a checkpoint keeps."""

    num_released: int  # rounds released so far
    clip_bound: float  # the next round's (it adapts between rounds)
    accounted_as: str  # each round's release as the accountant sees it: a resume must not change it
    history: list[list[torch.Tensor]]  # DP-FTRL's last bands - 1 noise draws, most recent last


@dataclass
class PrivacyLedger:
    """The driver's central DP: settings fixed at build, and the state that changes by round."""

    config: CentralPrivacy
    spending: Spending  # what each round spends, and the epsilon after r rounds
    denominator: float  # the expected total weight: what the sums divide by
    expected_cohort: float  # the adaptive count's denominator
    seed: int
    salt: int  # the job's noise_salt: another job's noise is independent of this one's
    state: LedgerState
    groups: np.ndarray | None = None  # DP-FTRL's client groups over the pool (None: fresh noise)
    rounds_allowed: int | None = None  # fewer than the job's where the budget stops the run
    empty_sums: Partial | None = None  # the last round's sums zeroed: what an empty cohort noises
    latest: Metrics = field(default_factory=dict)  # the last release's privacy/* metrics

    @classmethod
    def of(
        cls, job: JobConfig, spending: Spending, examples: np.ndarray, rounds_allowed: int | None = None
    ) -> PrivacyLedger:
        """A fresh ledger; ``examples`` each training client's, in pool order (capped weights divide
        by the expected cohort's total weight)."""
        central = job.privacy.central if job.privacy is not None else None
        assert central is not None  # built only for a job with central DP
        cohort = float(job.engine.cohort_size)
        mean_weight = float(np.mean([client_weight(n, central.weight_cap) for n in examples]))
        groups = cyclic_groups(len(examples), central.bands, job.seed) if central.bands > 1 else None
        state = LedgerState(0, central.clip_bound, spending.describe(), [])
        salt = noise_salt(job)
        return cls(
            central, spending, cohort * mean_weight, cohort, job.seed, salt, state, groups, rounds_allowed
        )

    def clipping(self) -> ClientClipping:
        """What the workers need this round: the bound, and the weights' cap."""
        return ClientClipping(self.state.clip_bound, self.config.weight_cap)

    def release(self, aggregator: Aggregator[Any], partial: object, round_num: int) -> Any:
        """The round's aggregate as the plugin's server step receives it: the merged sums noised
        and divided by the fixed denominator; then the bound's adaptive step and the accounting."""
        if not isinstance(aggregator, Summing) or not isinstance(partial, PrivatePartial):
            raise TypeError(f"central DP releases clipped sums, not {type(partial).__name__}")
        sums, state = self._sums_of(partial, round_num), self.state
        generator = torch.Generator().manual_seed(noise_seed(self.seed, round_num, salt=self.salt))
        std = self.spending.sum_noise_multiplier * state.clip_bound
        noise = [std * draw for draw in gaussian_draws(sums, generator)]
        history = state.history
        if self.config.bands > 1:  # DP-FTRL: this round's share of the correlated noise
            noise = correlated(noise, history, band_coefficients(self.config.bands))
            history = kept(history, noise, self.config.bands)
        aggregate = released(aggregator, add_noise(sums, noise), self.denominator)
        bound = state.clip_bound
        if self.config.adaptive is not None:
            bound = self._adapted(int(partial.num_within_bound), partial.num_clients, generator)
        self.state = replace(state, num_released=state.num_released + 1, clip_bound=bound, history=history)
        self.latest = {
            "privacy/epsilon": self.spending.epsilon(self.state.num_released),
            "privacy/noise_multiplier": self.spending.noise_multiplier,
            "privacy/clip_bound": state.clip_bound,  # the bound this round clipped to
            "privacy/cohort": float(partial.num_clients),
        }
        return aggregate

    def _sums_of(self, partial: PrivatePartial, round_num: int) -> Partial:
        """The round's sums; for an empty Poisson cohort, zeros shaped as the last round's, so the
        noise is released all the same (a skipped release would tell)."""
        if partial.num_clients:
            self.empty_sums = map_tensors(torch.zeros_like, partial.sums)
            return partial.sums
        if self.empty_sums is None:
            raise ConfigError(
                [
                    f"engine.sampling: round {round_num} drew no client (Poisson sampling) before any "
                    f"round of this run showed the shape of the sums to noise; raise engine.cohort_size, "
                    f"the expected cohort"
                ]
            )
        return self.empty_sums

    def _adapted(self, num_within_bound: int, num_clients: int, generator: torch.Generator) -> float:
        """Andrew et al.'s geometric step ``C * exp(-eta * (b - gamma))``, ``b`` the noised fraction
        of the expected cohort whose contribution was within the bound. The count is centred (each
        client adds ``within - 1/2``, so one client moves it by 1/2, the sensitivity its noise is
        accounted for) and 1/2 added back after the division; ``b`` clipped to [0, 1], as
        TF-Privacy's quantile estimator does (post-processing)."""
        adaptive = self.config.adaptive
        assert adaptive is not None
        draw = float(torch.randn((), generator=generator, dtype=torch.float64))
        centred = num_within_bound - num_clients / 2 + self.spending.count_stddev * draw
        fraction = min(max(centred / self.expected_cohort + 0.5, 0.0), 1.0)
        return self.state.clip_bound * math.exp(
            -adaptive.learning_rate * (fraction - adaptive.target_quantile)
        )

    def metrics(self) -> Metrics:
        """The latest release's ``privacy/*`` metrics."""
        return dict(self.latest)

    def restore(self, saved: object, path: str) -> None:
        """A resumed run's ledger goes on from its checkpoint's state (``stored.plain`` of a
        ``LedgerState``)."""
        try:
            state = from_plain(LedgerState, saved, "its privacy ledger")
            bound, history = float(state.clip_bound), [[torch.as_tensor(t) for t in d] for d in state.history]
            state = replace(state, num_released=int(state.num_released), clip_bound=bound, history=history)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: {exc}; resume from an earlier checkpoint of the run") from None
        if not (state.num_released >= 0 and math.isfinite(bound) and bound > 0):
            raise CheckpointError(
                f"{path}: its privacy ledger says {state.num_released} rounds released and clip bound "
                f"{bound}; resume from an earlier checkpoint of the run"
            )
        if state.accounted_as != self.state.accounted_as:
            raise CheckpointError(
                f"{path}: its rounds released {state.accounted_as}; this job's would release "
                f"{self.state.accounted_as}. The accountant composes one kind of round: resume with "
                f"the earlier run's privacy, sampling and cohort settings (a target_epsilon is "
                f"calibrated for engine.num_rounds: give its noise_multiplier instead)"
            )
        self.state = state
