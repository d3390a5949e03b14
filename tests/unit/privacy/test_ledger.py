"""The driver's half of central DP (raysim/privacy/ledger.py) against hand-computed values.

Derivation. The ledger releases ``(S + noise) / D`` for the merged clipped sums ``S``, with noise of
std ``z * C`` per coordinate (fresh, or DP-FTRL's ``y_t = (z_t - sum_k c_k y_{t-k}) / c_0`` with
``c_k = binom(2k, k) / 4^k`` normalised); under adaptive clipping the next bound is
``C * exp(-eta * (b - gamma))``, ``b`` the (noised) count within the bound over the expected cohort.
"""

import math

import numpy as np
import pytest
import torch

from algorithms.fedfish import FisherUpdate, FisherWeightedMean
from raysim.aggregate import WeightedMean
from raysim.config.privacy import AdaptiveClipping, CentralPrivacy
from raysim.errors import CheckpointError, ConfigError
from raysim.privacy.accounting import SampledGaussian
from raysim.privacy.ledger import LedgerState, PrivacyLedger
from raysim.privacy.spending import Spending
from raysim.private_sums import ClientClipping, ClippedSums
from raysim.sampling import noise_seed
from raysim.stored import plain
from raysim.types import ClientResult


def ledger(z: float = 2.0, **central) -> PrivacyLedger:
    config = CentralPrivacy(**({"clip_bound": 1.0, "noise_multiplier": z} | central))
    release = SampledGaussian("poisson", 100, 10, z)
    bands = config.bands if config.bands > 1 else None
    spending = Spending(z, z, 0.0, release, 1e-5, "rdp", bands)
    state = LedgerState(0, config.clip_bound, spending.describe(), [])
    return PrivacyLedger(
        config, spending, denominator=10.0, expected_cohort=10.0, seed=5, salt=0, state=state
    )


def partial(*updates: list[float], aggregator=None, bound: float = 1.0):
    clipped = ClippedSums(aggregator or WeightedMean(), ClientClipping(clip_bound=bound))
    acc = clipped.zero()
    for position, values in enumerate(updates):
        acc = clipped.add(acc, position, ClientResult({"w": torch.tensor(values)}, 1.0, {}))
    return acc


def test_without_noise_the_release_is_the_clipped_sum_over_the_fixed_denominator():
    out = ledger(z=0.0).release(WeightedMean(), partial([0.3, 0.4], [3.0, 4.0], [0.0, 0.1]), round_num=0)
    # clipped to 1: (0.3, 0.4) stays, (3, 4) -> (0.6, 0.8), (0, 0.1) stays; divided by D = 10, not 3
    np.testing.assert_allclose(out["w"].numpy(), [(0.3 + 0.6 + 0.0) / 10, (0.4 + 0.8 + 0.1) / 10], rtol=1e-6)


def test_without_noise_fedfish_releases_its_fisher_weighted_mean_of_clipped_contributions():
    deltas, fishers = [[1.0, 2.0], [3.0, -1.0]], [[2.0, 1.0], [1.0, 3.0]]
    aggregator = FisherWeightedMean()
    clipped = ClippedSums(aggregator, ClientClipping(clip_bound=1.0))
    acc = clipped.zero()
    for position, (d, f) in enumerate(zip(deltas, fishers, strict=True)):
        update = FisherUpdate({"w": torch.tensor(d)}, {"w": torch.tensor(f)})
        acc = clipped.add(acc, position, ClientResult(update, 1.0, {}))
    out = ledger(z=0.0).release(aggregator, acc, round_num=0)
    num, den = np.zeros(2), np.zeros(2)
    for d, f in zip(np.array(deltas), np.array(fishers), strict=True):
        joint = np.sqrt(((f * d) ** 2).sum() + (f**2).sum() + (d**2).sum())  # F*delta, F, delta together
        scale = min(1.0, 1.0 / joint)
        num, den = num + scale * f * d, den + scale * f
    np.testing.assert_allclose(out.pseudo_grad["w"].numpy(), num / den, rtol=1e-6)


def test_the_noise_has_std_z_c_over_d_and_the_metrics_say_the_round():
    book = ledger()
    out = book.release(WeightedMean(), partial(*[[0.0] * 50_000] * 3), round_num=0)["w"].numpy()
    assert abs(out.std() - 0.2) < 5 * 0.2 / math.sqrt(2 * out.size)  # z C / D = 2 * 1 / 10
    metrics = book.metrics()
    assert metrics["privacy/clip_bound"] == 1.0 and metrics["privacy/cohort"] == 3
    assert book.state.num_released == 1
    assert metrics["privacy/epsilon"] == book.spending.epsilon(1) > 0


def test_adaptive_clipping_takes_andrew_et_als_geometric_step():
    book = ledger(adaptive=AdaptiveClipping(target_quantile=0.5, learning_rate=0.2))  # no count noise
    book.release(WeightedMean(), partial([0.1], [0.2], [3.0], [0.5]), round_num=0)  # 3 of 4 within 1
    # centred: b = (3 - 4 / 2) / 10 + 1/2 = 0.6 of the expected cohort of 10
    assert book.state.clip_bound == pytest.approx(1.0 * math.exp(-0.2 * (0.6 - 0.5)))
    assert book.clipping() == ClientClipping(clip_bound=book.state.clip_bound)


def band(bands: int) -> np.ndarray:
    c = np.array([math.comb(2 * k, k) / 4**k for k in range(bands)])
    return c / np.linalg.norm(c)


def test_banded_noise_solves_the_banded_toeplitz_system_round_by_round():
    book = ledger(bands=3)
    out = [
        book.release(WeightedMean(), partial([0.0, 0.0]), r)["w"].double().numpy() * 10.0 for r in range(4)
    ]
    generators = [torch.Generator().manual_seed(noise_seed(5, r, salt=0)) for r in range(4)]
    fresh = [torch.randn(2, generator=g, dtype=torch.float64).numpy() * 2.0 for g in generators]
    c = band(3)
    matrix = sum(np.diag(np.full(4 - k, c[k]), -k) for k in range(3))  # C, lower-triangular Toeplitz
    np.testing.assert_allclose(np.stack(out), np.linalg.solve(matrix, np.stack(fresh)), rtol=1e-5, atol=1e-6)


def test_an_empty_cohort_releases_noise_shaped_as_the_last_round():
    book = ledger()
    with pytest.raises(ConfigError, match="drew no client"):
        book.release(WeightedMean(), partial(), round_num=0)
    book.release(WeightedMean(), partial([0.5, 0.5]), round_num=1)
    empty = book.release(WeightedMean(), partial(), round_num=2)
    assert empty["w"].shape == (2,) and bool(empty["w"].ne(0).all()) and book.state.num_released == 2


def test_the_ledger_survives_a_checkpoint_and_refuses_another_noise_or_a_corrupt_state():
    book = ledger(bands=2)
    book.release(WeightedMean(), partial([0.3]), round_num=0)
    again = ledger(bands=2)
    again.restore(plain(book.state), "ckpt.pt")
    assert (again.state.num_released, again.state.clip_bound) == (1, 1.0)
    torch.testing.assert_close(again.state.history[0][0], book.state.history[0][0])
    with pytest.raises(
        CheckpointError, match=r"noise multiplier 2, .*this job's would release .*noise multiplier 3,"
    ):
        ledger(z=3.0, bands=2).restore(plain(book.state), "ckpt.pt")
    with pytest.raises(CheckpointError, match="ckpt.pt: its privacy ledger holds"):
        again.restore({"rounds": 1}, "ckpt.pt")
    with pytest.raises(CheckpointError, match="clip bound nan"):
        again.restore(plain(LedgerState(1, float("nan"), book.state.accounted_as, [])), "ckpt.pt")
