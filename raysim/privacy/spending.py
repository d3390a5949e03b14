"""What a run's central DP spends: the noise it adds each round, and the epsilon after r rounds.

A run's noise multiplier ``z`` is given (``privacy.central.noise_multiplier``) or calibrated before
training from ``target_epsilon`` at ``delta`` after the job's rounds. Under adaptive clipping the
round releases two Gaussian sums on the same sample, the updates' and the count's, and ``z`` is the
pair's: the updates' multiplier is lowered so that together they spend what ``z`` alone would
(Andrew et al. 2021, Theorem 1). Under DP-FTRL's banded noise the epsilon is that of ``ceil(r / b)``
Poisson-sampled Gaussians (``raysim.privacy.banded_noise.banded_event``).

Usage:
    spending = spending_of(job.privacy, "poisson", population=1000, cohort_size=50, num_rounds=100)
    spending.noise_multiplier, spending.epsilon(10), spending.rounds_within(4.0, 100)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from raysim.config.privacy import PrivacyConfig
from raysim.privacy.accounting import (
    AccountantKind,
    SampledGaussian,
    Sampling,
    accountable,
    calibrate,
    epsilon,
    epsilon_of_event,
    update_noise_multiplier,
)
from raysim.privacy.banded_noise import banded_event
from raysim.sampling import poisson_rate

COUNT_SHARE = 20  # Andrew et al.'s count noise: the expected cohort over 20 clients


@dataclass(frozen=True)
class Spending:
    """One run's central DP, as the accountant sees it."""

    noise_multiplier: float  # the run's z: the noise std over the bound, updates and count together
    sum_noise_multiplier: float  # the updates' own (z itself without adaptive clipping)
    count_stddev: float  # the adaptive count's noise std, in clients (0: no count released)
    release: SampledGaussian  # one round
    delta: float
    accountant: AccountantKind
    bands: int | None = None  # DP-FTRL's bands; None: fresh noise every round

    def epsilon(self, rounds: int) -> float:
        """Epsilon at ``delta`` after ``rounds`` releases (0 for none)."""
        if rounds <= 0:
            return 0.0
        if self.bands is None:
            return epsilon(self.release, rounds, self.delta, self.accountant)
        event = banded_event(self.noise_multiplier, self.release.rate, rounds, self.bands)
        return epsilon_of_event(event, self.delta, self.accountant)

    def describe(self) -> str:
        """Each round as the accountant sees it, in words: equal for two runs exactly when their
        rounds are accounted alike (a resumed run's ledger compares them)."""
        release = self.release
        count = f" and a count of noise std {self.count_stddev:g}" if self.count_stddev else ""
        bands = f", DP-FTRL over {self.bands} bands" if self.bands is not None else ""
        return (
            f"{release.sampling} sampling of {release.sample_size:g} of {release.population} clients, "
            f"noise multiplier {self.noise_multiplier:.6g}{count}{bands} "
            f"({self.accountant} at delta {self.delta:g})"
        )

    def rounds_within(self, target: float, max_rounds: int) -> int:
        """The most rounds (up to ``max_rounds``) whose epsilon stays at most ``target``: epsilon
        grows with the rounds, so a bisection finds the last."""
        low, high = 0, max_rounds
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.epsilon(mid) <= target else (low, mid - 1)
        return low


def spending_of(
    privacy: PrivacyConfig, sampling: Sampling, population: int, cohort_size: int, num_rounds: int
) -> Spending:
    """The run's spending, its noise calibrated where ``target_epsilon`` is set.

    Raises:
        ValueError: the accountant cannot handle the sampling, or no noise reaches the target.
    """
    central, delta = privacy.central, privacy.delta
    assert central is not None and delta is not None  # the config requires delta with central DP
    if (reason := accountable(sampling, privacy.accountant)) is not None:
        raise ValueError(reason)
    bands = central.bands if central.bands > 1 else None
    # what the engine samples with: Poisson's rate from the one function both use (under DP-FTRL,
    # within the round's group of clients); a fixed cohort is cohort_size of the population
    if sampling == "poisson":
        poisson_rate(population, cohort_size, central.bands)  # refuses a rate above 1
        release = SampledGaussian(sampling, population, cohort_size * central.bands, 1.0)
    else:
        release = SampledGaussian(sampling, population, cohort_size, 1.0)
    z = central.noise_multiplier
    if z is None:
        assert central.target_epsilon is not None  # the config sets one of the two
        if bands is None:
            z = calibrate(central.target_epsilon, delta, num_rounds, release, privacy.accountant)
        else:
            z = _calibrate_banded(
                central.target_epsilon, delta, num_rounds, release.rate, bands, privacy.accountant
            )
    count_stddev = 0.0
    sum_z = z
    if central.adaptive is not None:
        count_stddev = central.adaptive.count_stddev or cohort_size / COUNT_SHARE
        if 2 * count_stddev <= z:  # the count alone would spend the whole budget
            raise ValueError(
                f"adaptive.count_stddev {count_stddev:g} (clients) leaves no noise for the updates: the "
                f"count spends what noise multiplier {z:.4g} allows when 2 x count_stddev <= {z:.4g}; set "
                f"privacy.central.adaptive.count_stddev above {z / 2:.4g}"
            )
        sum_z = update_noise_multiplier(z, count_stddev)
        release = replace(release, noise_multiplier=sum_z, count_noise_multiplier=2 * count_stddev)
    else:
        release = replace(release, noise_multiplier=z)
    return Spending(z, sum_z, count_stddev, release, delta, privacy.accountant, bands)


def _calibrate_banded(
    target: float, delta: float, rounds: int, rate: float, bands: int, kind: AccountantKind
) -> float:
    """The smallest noise multiplier whose banded epsilon after ``rounds`` is at most ``target``."""
    low, high = 1e-3, 1e3
    if epsilon_of_event(banded_event(high, rate, rounds, bands), delta, kind) > target:
        raise ValueError(
            f"target_epsilon {target:g} at delta {delta:g} after {rounds} rounds: even noise "
            f"multiplier {high:g} spends more; raise the target or lower the rounds"
        )
    for _ in range(60):  # a bisection in the log: epsilon falls as the noise grows
        mid = (low * high) ** 0.5
        low, high = (
            (low, mid)
            if epsilon_of_event(banded_event(mid, rate, rounds, bands), delta, kind) <= target
            else (mid, high)
        )
    return high
