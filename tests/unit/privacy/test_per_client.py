"""A client's epsilon: local DP over its reports, DP-SGD over its steps.

The references are dp-accounting's own events, written out here, and the mechanisms' laws checked
from first principles: a Laplace report's privacy loss is the log-ratio of its densities at two
updates the clip ball holds; a Gaussian's exact (epsilon, delta) curve (Balle & Wang, ICML 2018,
Theorem 8) lies below RDP's bound, which lies below the classical conversion of Mironov 2017."""

import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from raysim.config.privacy import LocalPrivacy, SamplePrivacy
from raysim.privacy.per_client import local_epsilon, sample_epsilon


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


def test_sample_epsilon_is_the_poisson_sampled_gaussian_composed_over_the_steps():
    config = SamplePrivacy(clip_bound=1.0, noise_multiplier=1.1)
    step = dp_accounting.PoissonSampledDpEvent(32 / 600, dp_accounting.GaussianDpEvent(1.1))
    expected = rdp_epsilon(dp_accounting.SelfComposedDpEvent(step, 190), 1e-5)
    assert sample_epsilon(config, num_examples=600, batch_size=32, steps=190, delta=1e-5) == pytest.approx(
        expected
    )
    # sampling amplifies: the same steps on every example (q = 1) cost more
    whole = sample_epsilon(config, num_examples=20, batch_size=32, steps=190, delta=1e-5)
    assert whole == pytest.approx(
        rdp_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.1), 190), 1e-5)
    )
    assert whole > expected


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
