"""What user-level DP-FedAvg's rounds cost in privacy, and the noise a budget allows.

The law. Each round samples a cohort from the population of N clients, clips each sampled
client's contribution to L2 norm C, and adds Gaussian noise of std ``z * C`` to the sum (McMahan
et al., ICLR 2018, arXiv:1710.06963). ``z`` is the noise multiplier; one round is one release,
``rounds`` releases compose.

- ``poisson``: each client is in the cohort independently with probability ``q = m / N`` (``m``
  the expected cohort). Neighbours add or remove one client, whose contribution moves the sum by
  at most C: one round is ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under ADD_OR_REMOVE_ONE.
- ``fixed``: exactly ``m`` clients uniformly without replacement. N is public, so neighbours
  replace one client (REPLACE_ONE); the sum then moves by up to 2C (``c - c'``, both of norm at
  most C), and the noise measured in that sensitivity is ``z / 2``:
  ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))``.
- Adaptive clipping (Andrew et al., NeurIPS 2021, arXiv:1905.03871) releases a second Gaussian
  query on the same cohort each round: the count of clients whose norm was at most C, centred
  (``b_i - 1/2``, sensitivity 1/2) with noise std ``sigma_b``, so its multiplier is
  ``z_b = 2 sigma_b`` (``z_b / 2`` under REPLACE_ONE, where the centred count moves by 1). The
  pair is a ``ComposedDpEvent`` of the two Gaussians inside the sampled event; on one sample it
  equals one Gaussian of ``z_eff = (z^-2 + z_b^-2)^(-1/2)`` (McMahan et al. 2018, arXiv:1812.06210,
  sec. 3, as dp-accounting cites it), which is how RDP composes it and how PLD and PRV, which
  take a single Gaussian inside a Poisson sample, are given it.

Every epsilon comes from dp-accounting 0.6.0 (RDP, PLD) or prv-accountant 0.2.0 (PRV, through
``raysim.privacy.prv``); nothing here is an accountant. ``accountable`` says which pairs of
sampling and accountant have a guarantee.

Usage:
    release = SampledGaussian("poisson", population=10_000, sample_size=100, noise_multiplier=1.0)
    eps = epsilon(release, rounds=500, delta=1e-6)
    z = calibrate(target_epsilon=3.0, delta=1e-6, rounds=500, release=release, kind="pld")
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from dp_accounting import dp_event, mechanism_calibration, privacy_accountant
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.config.privacy import accountant_problem
from raysim.privacy.prv import PrvAccountant


class _ExcludedOrders(logging.Filter):
    """Drops dp-accounting's note that an RDP order did not converge and was left out: the bound
    from the remaining orders is still valid, and a run would print it every round."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Excluding this order" not in record.getMessage()


logging.getLogger("absl").addFilter(_ExcludedOrders())

Sampling = Literal["poisson", "fixed"]
AccountantKind = Literal["rdp", "pld", "prv"]

_RELATION = {
    "poisson": privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "fixed": privacy_accountant.NeighboringRelation.REPLACE_ONE,
}
_MAX_NOISE = 2.0**12  # calibrate's bracket stops doubling here: epsilon is tiny by then for any real run
_MIN_NOISE = 2.0**-12


@dataclass(frozen=True)
class SampledGaussian:
    """One release as an accountant sees it: a sample of ``sample_size`` records (expected, for
    poisson) from ``population``, a Gaussian sum of clipped contributions.

    ``noise_multiplier`` is the std of the noise on the sum over the clip bound;
    ``count_noise_multiplier`` is adaptive clipping's ``z_b = 2 sigma_b``, None without one.
    """

    sampling: Sampling
    population: int
    sample_size: float
    noise_multiplier: float
    count_noise_multiplier: float | None = None

    def __post_init__(self) -> None:
        if self.sampling not in _RELATION:
            raise ValueError(f"sampling must be one of {sorted(_RELATION)}, got {self.sampling!r}")
        if self.population != int(self.population) or self.population < 1:
            raise ValueError(
                f"population must be a whole number of clients, at least 1; got {self.population}"
            )
        if not 0 < self.sample_size <= self.population:
            raise ValueError(
                f"sample_size must be in (0, population={self.population}], so that the sampling "
                f"rate q is in (0, 1]; got {self.sample_size} (q = {self.sample_size / self.population:g})"
            )
        if self.sampling == "fixed" and not float(self.sample_size).is_integer():
            raise ValueError(f"fixed-size sampling draws a whole number of clients, got {self.sample_size}")
        _check_noise("noise_multiplier", self.noise_multiplier)
        if self.count_noise_multiplier is not None:
            _check_noise("count_noise_multiplier", self.count_noise_multiplier)

    @property
    def rate(self) -> float:
        """The chance that a given client is in a round's sample."""
        return self.sample_size / self.population


def _check_noise(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and non-negative, got {value}")


def _sensitivity_scale(release: SampledGaussian) -> float:
    """How far one neighbour moves both queries, in units of their add-or-remove sensitivity (C for
    the sum, 1/2 for the centred count): replacing a client is a removal plus an addition."""
    return 2.0 if release.sampling == "fixed" else 1.0


def effective_noise_multiplier(release: SampledGaussian) -> float:
    """The one Gaussian's ``z_eff = (z^-2 + z_b^-2)^(-1/2)`` that the round's queries amount to
    (``z`` without a count query; 0 when either query is noiseless)."""
    z, z_b = release.noise_multiplier, release.count_noise_multiplier
    if z_b is None:
        return z
    if z == 0 or z_b == 0:
        return 0.0
    return (z**-2 + z_b**-2) ** -0.5


def update_noise_multiplier(total_z: float, count_stddev: float) -> float:
    """The sum's noise multiplier that leaves the pair (sum, count) at ``total_z`` in all.

    Andrew et al. (arXiv:1905.03871): ``z_delta = (total_z^-2 - (2 sigma_b)^-2)^(-1/2)``.

    Raises:
        ValueError: when ``2 * count_stddev <= total_z``: the count's noise alone would spend the budget.
    """
    if not (math.isfinite(total_z) and total_z > 0):
        raise ValueError(f"total_z must be finite and positive, got {total_z}")
    _check_noise("count_stddev", count_stddev)
    z_b = 2 * count_stddev
    if z_b <= total_z:
        raise ValueError(
            f"adaptive clipping's count noise (2 * sigma_b = {z_b:g}) must exceed the total noise "
            f"multiplier {total_z:g}: with it the count query alone spends the whole budget; "
            f"raise sigma_b or lower total_z"
        )
    return float((total_z**-2 - z_b**-2) ** -0.5)


def release_event(release: SampledGaussian) -> dp_event.DpEvent:
    """One round as a dp-accounting event, the count query of adaptive clipping composed in."""
    scale = _sensitivity_scale(release)
    query: dp_event.DpEvent = dp_event.GaussianDpEvent(float(release.noise_multiplier) / scale)
    if release.count_noise_multiplier is not None:
        count = dp_event.GaussianDpEvent(float(release.count_noise_multiplier) / scale)
        query = dp_event.ComposedDpEvent([query, count])
    return _sampled(release, query)


def _sampled(release: SampledGaussian, query: dp_event.DpEvent) -> dp_event.DpEvent:
    if release.sampling == "fixed":
        return dp_event.SampledWithoutReplacementDpEvent(release.population, int(release.sample_size), query)
    return dp_event.PoissonSampledDpEvent(release.rate, query)


def _accounted_event(release: SampledGaussian, kind: AccountantKind) -> dp_event.DpEvent:
    """The event ``kind`` composes: ``release_event``, or for PLD and PRV (one Gaussian inside a
    Poisson sample only) the same round with its two queries as the one Gaussian they equal."""
    if kind == "rdp" or release.count_noise_multiplier is None:
        return release_event(release)
    single = dp_event.GaussianDpEvent(effective_noise_multiplier(release) / _sensitivity_scale(release))
    return _sampled(release, single)


def _fresh_accountant(kind: AccountantKind, sampling: Sampling) -> privacy_accountant.PrivacyAccountant:
    if kind == "rdp":
        return rdp_privacy_accountant.RdpAccountant(neighboring_relation=_RELATION[sampling])
    if kind == "pld":
        return pld_privacy_accountant.PLDAccountant(neighboring_relation=_RELATION[sampling])
    return PrvAccountant()


def accountable(sampling: Sampling, kind: AccountantKind) -> str | None:
    """None when ``kind`` computes a guarantee for ``sampling``; else why not, and what to use (the
    config's table, ``raysim.config.privacy.ACCOUNTED_SAMPLINGS``, checked when a job is read)."""
    return accountant_problem(kind, sampling)


def epsilon(release: SampledGaussian, rounds: int, delta: float, kind: AccountantKind = "rdp") -> float:
    """Epsilon at ``delta`` after ``rounds`` identical releases: 0.0 for none, inf with no noise.

    Raises:
        ValueError: on a bad ``rounds`` or ``delta``, or a pair of sampling and ``kind`` that
            ``accountable`` refuses.
    """
    _check_delta(delta)
    rounds = _whole_rounds(rounds)
    _check_accountable(release.sampling, kind)
    if rounds == 0:
        return 0.0
    if effective_noise_multiplier(release) == 0:
        return math.inf
    return _epsilon(release, rounds, delta, kind)


def epsilon_of_event(event: dp_event.DpEvent, delta: float, kind: AccountantKind = "rdp") -> float:
    """Epsilon at ``delta`` of a whole run given as one event of Poisson-sampled Gaussians (DP-FTRL's
    ``raysim.privacy.banded_noise.banded_event``), by the accountant ``kind``.

    Raises:
        ValueError: on a bad ``delta``, or an event that accountant cannot compose.
    """
    _check_delta(delta)
    accountant = _fresh_accountant(kind, "poisson")
    if not accountant.supports(event):
        raise ValueError(f"the {kind} accountant cannot compose {type(event).__name__}: use accountant: rdp")
    return float(accountant.compose(event).get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def _epsilon(release: SampledGaussian, rounds: int, delta: float, kind: AccountantKind) -> float:
    # memoized: the engine asks once per round, rounds_within and calibrate's bracket ask again
    if kind == "rdp":
        orders, one_round = _one_round_rdp(release)
        # what RdpAccountant.compose(event, rounds) does: the RDP of `rounds` releases is rounds times one's
        return float(rdp_privacy_accountant.compute_epsilon(orders, rounds * one_round, delta)[0])
    accountant = _fresh_accountant(kind, release.sampling)
    return float(accountant.compose(_accounted_event(release, kind), rounds).get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def _one_round_rdp(release: SampledGaussian) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP of one round at each): the costly part, computed once per release."""
    accountant = rdp_privacy_accountant.RdpAccountant(neighboring_relation=_RELATION[release.sampling])
    accountant.compose(release_event(release))
    return accountant.orders, accountant.rdp


def calibrate(
    target_epsilon: float, delta: float, rounds: int, release: SampledGaussian, kind: AccountantKind = "rdp"
) -> float:
    """The smallest noise multiplier whose epsilon after ``rounds`` is at most ``target_epsilon``.

    ``release.noise_multiplier`` is ignored; an adaptive-clipping count query keeps its own noise.

    Raises:
        ValueError: on bad inputs, a refused pair of sampling and ``kind``, or a target that no
            noise reaches (the count query alone spends more, or the target is tiny).
    """
    _check_target(target_epsilon)
    _check_delta(delta)
    rounds = _whole_rounds(rounds, least=1)
    _check_accountable(release.sampling, kind)
    low, high = _bracket(target_epsilon, delta, rounds, release, kind)
    if low == high:  # even the smallest noise tried meets a target this loose
        return low

    def event(z: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(
            _accounted_event(replace(release, noise_multiplier=z), kind), rounds
        )

    z = mechanism_calibration.calibrate_dp_mechanism(
        lambda: _fresh_accountant(kind, release.sampling),
        event,
        target_epsilon,
        delta,
        mechanism_calibration.ExplicitBracketInterval(low, high),
        tol=low * 1e-3,  # epsilon within about 0.2% below the target
    )
    return float(z)


def _bracket(
    target_epsilon: float, delta: float, rounds: int, release: SampledGaussian, kind: AccountantKind
) -> tuple[float, float]:
    """(low, high): noise multipliers a factor 2 apart, epsilon above the target at low and at most
    the target at high."""

    def spent(z: float) -> float:
        return epsilon(replace(release, noise_multiplier=z), rounds, delta, kind)

    if release.count_noise_multiplier is not None:
        count_alone = replace(
            release, noise_multiplier=release.count_noise_multiplier, count_noise_multiplier=None
        )
        if epsilon(count_alone, rounds, delta, kind) > target_epsilon:
            raise ValueError(
                f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta} after {rounds} "
                f"rounds: adaptive clipping's count query alone (z_b = {release.count_noise_multiplier:g}) "
                f"spends more; raise its noise or the target"
            )
    high = 1.0
    while spent(high) > target_epsilon:
        if high >= _MAX_NOISE:
            raise ValueError(
                f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta} after {rounds} "
                f"rounds: the largest tried, {high:g}, still spends {spent(high):.4g}"
            )
        high *= 2
    low = high / 2
    while spent(low) <= target_epsilon:
        if low <= _MIN_NOISE:
            return low, low
        low, high = low / 2, low
    return low, high


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _check_target(target_epsilon: float) -> None:
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target epsilon must be finite and positive, got {target_epsilon}")


def _whole_rounds(rounds: int, least: int = 0) -> int:
    if rounds != int(rounds) or rounds < least:
        raise ValueError(f"rounds must be a whole number, at least {least}; got {rounds}")
    return int(rounds)  # an int for the accountants' counts (numpy ints and 3.0 come in too)


def _check_accountable(sampling: Sampling, kind: AccountantKind) -> None:
    if kind not in ("rdp", "pld", "prv"):
        raise ValueError(f"accountant must be one of rdp, pld, prv; got {kind!r}")
    reason = accountable(sampling, kind)
    if reason is not None:
        raise ValueError(reason)
