"""BandMF's streamed noise against dense linear algebra, brute force and dp-accounting written out.

The references are built here, not read from the module: ``C`` is the T x T banded Toeplitz matrix of
binom(2k, k) / 4^k (k < b) over its first column's norm, built entry by entry.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from raysim.privacy.banded_noise import (
    band_coefficients,
    banded_event,
    correlated,
    kept,
    sensitivity,
)


def reference_coefficients(bands: int) -> np.ndarray:
    raw = np.array([math.comb(2 * k, k) / 4**k for k in range(bands)])
    return raw / math.sqrt(sum(x * x for x in raw))


def reference_matrix(bands: int, num_rounds: int) -> np.ndarray:
    c = reference_coefficients(bands)
    matrix = np.zeros((num_rounds, num_rounds))
    for t in range(num_rounds):
        for s in range(num_rounds):
            if 0 <= t - s < bands:
                matrix[t, s] = c[t - s]
    return matrix


def stream(bands: int, draws: np.ndarray) -> np.ndarray:
    """Runs the noise over the rows of ``draws`` (one round each) as trees {"w": tensor}."""
    coefficients, history = band_coefficients(bands), []
    out = []
    for z in draws:
        y = correlated({"w": torch.from_numpy(z.copy())}, history, coefficients)
        history = kept(history, y, bands)
        out.append(y["w"].numpy())
    return np.stack(out)


@pytest.mark.parametrize("bands", [1, 2, 4])
def test_streamed_noise_is_the_dense_solve_of_c_y_equals_z(bands):
    draws = np.random.default_rng(0).standard_normal((10, 3))  # (T, d)
    streamed = stream(bands, draws)
    np.testing.assert_allclose(streamed, np.linalg.solve(reference_matrix(bands, 10), draws), rtol=1e-12)


def test_one_band_is_independent_noise_over_c0():
    assert list(band_coefficients(1)) == [1.0]
    draws = np.random.default_rng(1).standard_normal((5, 3))
    np.testing.assert_array_equal(stream(1, draws), draws)


def test_correlated_leaves_its_inputs_untouched_and_walks_the_tree():
    z = {"a": torch.ones(2), "b": {"c": torch.full((1,), 2.0)}}
    history = [{"a": torch.zeros(2), "b": {"c": torch.ones(1)}}]
    y = correlated(z, history, [2.0, 1.0])
    assert torch.equal(y["a"], torch.full((2,), 0.5)) and torch.equal(y["b"]["c"], torch.full((1,), 0.5))
    assert torch.equal(z["a"], torch.ones(2)) and torch.equal(history[0]["b"]["c"], torch.ones(1))


def test_kept_holds_the_last_b_minus_1_most_recent_last():
    assert kept([1, 2, 3], 4, bands=3) == [3, 4]
    assert kept([], 1, bands=3) == [1] and kept([1], 2, bands=4) == [1, 2]
    assert kept([1, 2], 3, bands=1) == []


def test_empirical_covariance_is_the_inverse_of_c_transpose_c():
    """y = C^-1 z with z ~ N(0, I) has covariance C^-1 C^-T = (C^T C)^-1. Each entry of the sample
    covariance over n draws (mean known to be 0) has standard error sqrt((S_ii S_jj + S_ij^2) / n);
    every entry must lie within 5 of them (fixed seed: the outcome is the same every run)."""
    bands, num_rounds, n = 3, 6, 100_000
    draws = np.random.default_rng(2).standard_normal((num_rounds, n))  # n draws per round as one tree
    noise = stream(bands, draws)  # (T, n)
    empirical = noise @ noise.T / n
    c = reference_matrix(bands, num_rounds)
    theory = np.linalg.inv(c.T @ c)
    standard_error = np.sqrt((np.outer(np.diag(theory), np.diag(theory)) + theory**2) / n)
    assert (np.abs(empirical - theory) <= 5 * standard_error).all()
    assert (np.abs(np.eye(num_rounds) - theory) / standard_error).max() > 50  # independent noise would fail


def brute_force_sensitivity(coefficients: np.ndarray, num_rounds: int, min_separation: int) -> float:
    """max ||C u|| over every non-empty set of rounds at least ``min_separation`` apart."""
    matrix = reference_matrix(len(coefficients), num_rounds)
    best = 0.0
    for size in range(1, num_rounds + 1):
        for rounds in itertools.combinations(range(num_rounds), size):
            if all(b - a >= min_separation for a, b in itertools.pairwise(rounds)):
                u = np.zeros(num_rounds)
                u[list(rounds)] = 1.0
                best = max(best, float(np.linalg.norm(matrix @ u)))
    return best


@pytest.mark.parametrize(
    ("bands", "min_separation"), [(1, 1), (2, 2), (3, 3), (2, 3), (3, 5), (3, 1), (8, 8), (12, 12)]
)
def test_sensitivity_closed_form_is_the_brute_force_maximum(bands, min_separation):
    c = band_coefficients(bands)
    assert sensitivity(c, 8, min_separation) == pytest.approx(brute_force_sensitivity(c, 8, min_separation))


def test_sensitivity_of_a_client_every_b_rounds_grows_as_the_root_of_its_participations():
    c = band_coefficients(3)
    assert sensitivity(c, 9, 3) == pytest.approx(math.sqrt(3))  # three full columns of norm 1


def test_sensitivity_refuses_overlapping_columns():
    with pytest.raises(ValueError, match="min_separation: 2 "):
        sensitivity(band_coefficients(3), 8, 2)


@pytest.mark.parametrize("bands", [1, 2, 5, 40])
def test_coefficients_are_binomials_over_4_to_the_k_normalised(bands):
    c = band_coefficients(bands)
    raw = np.array([math.comb(2 * k, k) / 4**k for k in range(bands)])
    np.testing.assert_allclose(c / c[0], raw, rtol=1e-12)  # the ratios fix the law up to the scale
    column_norms = np.linalg.norm(reference_matrix(bands, bands + 3), axis=0)
    assert column_norms.max() == pytest.approx(1.0, abs=1e-15) and (column_norms <= 1 + 1e-15).all()
    assert column_norms[-1] < 1 or bands == 1  # the last column is cut short by the run's end


def test_banded_event_is_dp_sgd_over_ceil_t_over_b_rounds():
    """T = 10 rounds in b = 4 groups: each client is eligible at most ceil(10 / 4) = 3 times."""
    sigma, q, delta = 1.1, 0.05, 1e-6
    direct = rdp.RdpAccountant()
    for _ in range(3):
        direct.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)))
    ours = rdp.RdpAccountant().compose(banded_event(sigma, q, 10, 4))
    assert ours.get_epsilon(delta) == pytest.approx(direct.get_epsilon(delta), rel=1e-12)
    every_round = rdp.RdpAccountant().compose(banded_event(sigma, q, 10, 1))
    assert ours.get_epsilon(delta) < every_round.get_epsilon(delta)  # fewer compositions: amplified


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: band_coefficients(0), "bands: must be at least 1, got 0"),
        (lambda: sensitivity(band_coefficients(2), 0, 2), "num_rounds: must be at least 1, got 0"),
        (lambda: banded_event(1.0, 0.0, 10, 2), r"rate: .* got 0.0"),
        (lambda: banded_event(1.0, 1.5, 10, 2), r"rate: .* got 1.5"),
        (lambda: banded_event(1.0, 0.5, 0, 2), "num_rounds: must be at least 1, got 0"),
        (lambda: banded_event(1.0, 0.5, 10, -1), "bands: must be at least 1, got -1"),
        (lambda: banded_event(-1.0, 0.5, 10, 2), "noise_multiplier: must be at least 0, got -1.0"),
        (lambda: correlated({"w": torch.ones(1)}, [{"w": torch.ones(1)}], [1.0]), "history: 1 noise trees"),
    ],
)
def test_bad_input_names_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()
