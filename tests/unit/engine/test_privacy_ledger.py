"""The driver's half of central DP (raysim/engine/privacy_ledger.py) against hand-computed values.

Derivation. The ledger releases ``(S + noise) / D`` for the merged clipped sums ``S``, with noise of
std ``z * C`` per coordinate (fresh, or DP-FTRL's ``y_t = (z_t - sum_k c_k y_{t-k}) / c_0`` with
``c_k = binom(2k, k) / 4^k`` normalised); under adaptive clipping the next bound is
``C * exp(-eta * (b - gamma))``, ``b`` the (noised) count within the bound over the expected cohort.
"""

import math

import numpy as np
import pytest
import torch

from raysim.aggregate import WeightedMean
from raysim.config.privacy import AdaptiveClipping, CentralPrivacy
from raysim.engine.privacy_ledger import PrivacyLedger
from raysim.errors import ConfigError
from raysim.private_sums import ClippedSums, PrivateRound
from raysim.privacy.accounting import SampledGaussian
from raysim.privacy.spending import Spending
from raysim.sampling import noise_seed
from raysim.types import ClientResult


def ledger(**central) -> PrivacyLedger:
    config = CentralPrivacy(**({"clip_bound": 1.0, "noise_multiplier": 2.0} | central))
    release = SampledGaussian("poisson", 100, 10, 2.0)
    spending = Spending(
        2.0, 2.0, 0.0, release, 1e-5, "rdp", config.bands if config.noise == "banded" else None
    )
    return PrivacyLedger(
        config, spending, denominator=10.0, expected_cohort=10.0, seed=5, clip_bound=config.clip_bound
    )


def partial(*updates: list[float]):
    aggregator = ClippedSums(WeightedMean(), PrivateRound(clip_bound=1.0))
    acc = aggregator.zero()
    for position, values in enumerate(updates):
        acc = aggregator.add(acc, position, ClientResult({"w": torch.tensor(values)}, 1.0, {}))
    return acc


def test_the_release_is_the_noised_sum_over_the_fixed_denominator():
    book = ledger()
    out = book.release(WeightedMean(), partial(*[[0.0] * 50_000] * 3), round_num=0)["w"].numpy()
    # S = 0, so out = noise / D with noise ~ N(0, (z C)^2): std z C / D = 0.2
    assert abs(out.std() - 0.2) < 5 * 0.2 / math.sqrt(2 * out.size)
    metrics = book.metrics()
    assert metrics["privacy/clip_bound"] == 1.0 and metrics["privacy/cohort"] == 3 and book.rounds == 1


def test_adaptive_clipping_takes_andrew_et_als_geometric_step():
    book = ledger(adaptive=AdaptiveClipping(target_quantile=0.5, learning_rate=0.2))  # no count noise
    book.release(WeightedMean(), partial([0.1], [0.2], [3.0], [0.5]), round_num=0)  # 3 of 4 within bound 1
    assert book.clip_bound == pytest.approx(1.0 * math.exp(-0.2 * (3 / 10 - 0.5)))
    assert book.round_options() == PrivateRound(clip_bound=book.clip_bound)


def band(bands: int) -> np.ndarray:
    c = np.array([math.comb(2 * k, k) / 4**k for k in range(bands)])
    return c / np.linalg.norm(c)


def test_banded_noise_solves_the_banded_toeplitz_system_round_by_round():
    book = ledger(noise="banded", bands=3)
    released = [
        book.release(WeightedMean(), partial([0.0, 0.0]), r)["w"].double().numpy() * 10.0 for r in range(4)
    ]
    fresh = [
        torch.randn(2, generator=torch.Generator().manual_seed(noise_seed(5, r)), dtype=torch.float64).numpy()
        * 2.0
        for r in range(4)
    ]
    c = band(3)
    matrix = sum(np.diag(np.full(4 - k, c[k]), -k) for k in range(3))  # C, lower-triangular Toeplitz
    np.testing.assert_allclose(
        np.stack(released), np.linalg.solve(matrix, np.stack(fresh)), rtol=1e-5, atol=1e-6
    )


def test_an_empty_cohort_releases_noise_shaped_as_the_last_round():
    book = ledger()
    with pytest.raises(ConfigError, match="drew no client"):
        book.release(WeightedMean(), partial(), round_num=0)
    book.release(WeightedMean(), partial([0.5, 0.5]), round_num=1)
    empty = book.release(WeightedMean(), partial(), round_num=2)
    assert empty["w"].shape == (2,) and bool(empty["w"].ne(0).all()) and book.rounds == 2


def test_the_ledger_survives_a_checkpoint_and_refuses_another_noise():
    book = ledger(noise="banded", bands=2)
    book.release(WeightedMean(), partial([0.3]), round_num=0)
    again = ledger(noise="banded", bands=2)
    again.restore(book.state(), "ckpt.pt")
    assert (again.rounds, again.clip_bound) == (1, 1.0)
    torch.testing.assert_close(again.history[0][0], book.history[0][0])
    other = PrivacyLedger(
        book.config, Spending(3.0, 3.0, 0.0, book.spending.release, 1e-5, "rdp", 2), 10.0, 10.0, 5, 1.0
    )
    with pytest.raises(ConfigError, match="cannot change its noise midway"):
        other.restore(book.state(), "ckpt.pt")
