"""A client's epsilon: local DP over its reports, DP-SGD over its steps at each rate it trained at.

The references are dp-accounting's own events, written out here, and the mechanisms' laws checked
from first principles: a Laplace report's privacy loss is the log-ratio of its densities at two
updates the clip ball holds; a Gaussian's exact (epsilon, delta) curve (Balle & Wang, ICML 2018,
Theorem 8) lies below RDP's bound, which lies below the classical conversion of Mironov 2017."""

import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from raysim.config.privacy import LocalPrivacy, SamplePrivacy
from raysim.privacy.per_client import SampledSteps, local_epsilon, sample_epsilon


def rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    accountant = RdpAccountant()
    accountant.compose(event)
    return accountant.get_epsilon(delta)


def test_laplace_reports_compose_to_twice_reports_over_noise_multiplier():
    """Two updates in the L1 ball of radius C can be 2C apart (C e_1 and -C e_1); at scale b =
    noise_multiplier * C the densities' log-ratio peaks at 2C / b = 2 / noise_multiplier."""
    config = LocalPrivacy(mechanism="laplace", clip_bound=3.0, noise_multiplier=4.0)
    b, u, v = 4.0 * 3.0, 3.0, -3.0
    peak = max(abs(-abs(x - u) / b + abs(x - v) / b) for x in [i / 10 for i in range(-200, 201)])
    assert local_epsilon(config, reports=1, delta=None) == pytest.approx(peak)
    assert local_epsilon(config, reports=5, delta=None) == pytest.approx(5 * 2 / 4.0)


def test_gaussian_reports_are_the_gaussian_mechanism_over_the_clip_balls_diameter():
    config = LocalPrivacy(mechanism="gaussian", clip_bound=1.0, noise_multiplier=4.0)
    delta, reports = 1e-5, 3
    # std 4 C over sensitivity 2 C: dp-accounting's noise multiplier 2
    expected = rdp_epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), reports), delta
    )
    epsilon = local_epsilon(config, reports, delta)
    assert epsilon == pytest.approx(expected)
    # three Gaussians of multiplier 2 are one of multiplier 2 / sqrt(3); its exact epsilon is below
    sigma = 2.0 / math.sqrt(reports)
    assert exact_gaussian_epsilon(sigma, delta) < epsilon
    orders = [1 + i / 10 for i in range(1, 1000)]
    assert epsilon <= min(a / (2 * sigma**2) + math.log(1 / delta) / (a - 1) for a in orders)


def test_a_gaussian_report_needs_delta():
    with pytest.raises(ValueError, match="privacy.delta"):
        local_epsilon(LocalPrivacy(clip_bound=1.0, noise_multiplier=1.0), reports=1, delta=None)


def poisson_steps(q: float, z: float, steps: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
    )


def test_sample_epsilon_is_the_poisson_sampled_gaussian_composed_over_the_steps():
    config = SamplePrivacy(clip_bound=1.0, noise_multiplier=1.1)
    expected = rdp_epsilon(poisson_steps(32 / 600, 1.1, 190), 1e-5)
    assert sample_epsilon(config, (SampledSteps(600, 32, 190),), 1e-5) == pytest.approx(expected, rel=1e-12)
    # sampling amplifies: the same steps on every example (q = 1) cost more
    whole = sample_epsilon(config, (SampledSteps(20, 32, 190),), 1e-5)
    assert whole == pytest.approx(
        rdp_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.1), 190), 1e-5)
    )
    assert whole > expected
    assert sample_epsilon(config, (), 1e-5) == 0.0 == sample_epsilon(config, (SampledSteps(5, 2, 0),), 1e-5)


def test_steps_at_different_rates_compose_as_dp_accountings_composed_event():
    """A client that trained on 600 examples, then on a capped 100, then on 600 again: one
    SelfComposedDpEvent per rate in a ComposedDpEvent, as dp-accounting composes them."""
    config = SamplePrivacy(clip_bound=1.0, noise_multiplier=1.1)
    runs = (SampledSteps(600, 32, 38), SampledSteps(100, 32, 4), SampledSteps(600, 16, 10))
    composed = dp_accounting.ComposedDpEvent(
        [poisson_steps(32 / 600, 1.1, 38), poisson_steps(32 / 100, 1.1, 4), poisson_steps(16 / 600, 1.1, 10)]
    )
    assert sample_epsilon(config, runs, 1e-5) == pytest.approx(rdp_epsilon(composed, 1e-5), rel=1e-12)
    # the larger rate costs more than the same steps at the smaller one
    same_rate = (SampledSteps(600, 32, 42), SampledSteps(600, 16, 10))
    assert sample_epsilon(config, runs, 1e-5) > sample_epsilon(config, same_rate, 1e-5)


def test_sample_epsilon_is_cached_by_its_arguments_and_refuses_impossible_counts():
    config = SamplePrivacy(clip_bound=1.0, noise_multiplier=0.9)
    runs = (SampledSteps(321, 8, 7),)
    first = sample_epsilon(config, runs, 1e-5)
    hits = sample_epsilon.cache_info().hits
    assert sample_epsilon(config, (SampledSteps(321, 8, 7),), 1e-5) == first
    assert sample_epsilon.cache_info().hits == hits + 1
    for bad in (SampledSteps(0, 8, 1), SampledSteps(10, 0, 1), SampledSteps(10, 8, -1)):
        with pytest.raises(ValueError, match="need examples, batch_size >= 1"):
            sample_epsilon(config, (bad,), 1e-5)


def exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The least epsilon at which the Gaussian mechanism of std ``sigma`` (sensitivity 1) is
    (epsilon, delta)-DP: Balle & Wang's delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s),
    decreasing in eps, solved by bisection."""

    def phi(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    def delta_at(eps: float) -> float:
        return phi(1 / (2 * sigma) - eps * sigma) - math.exp(eps) * phi(-1 / (2 * sigma) - eps * sigma)

    low, high = 0.0, 100.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if delta_at(mid) > delta else (low, mid)
    return high
