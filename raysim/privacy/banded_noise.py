"""DP-FTRL's correlated noise across rounds: banded matrix factorization (BandMF), streamed.

The law. The server's SGD releases prefix sums ``A x`` of the rounds' clipped sums x_0, x_1, ...
(``A`` lower-triangular ones). A matrix-factorization mechanism releases them as ``A (x + C^-1 z)``
with z_t ~ N(0, s^2 I) i.i.d., s = noise_multiplier * clip_bound: post-processing of the Gaussian
mechanism ``C x + z``, so any server optimiser keeps the guarantee (Kairouz et al. 2021,
arXiv:2103.00039; Denisov et al. 2022, arXiv:2202.08312). Round t's sum gets y_t = (C^-1 z)_t in
place of z_t. With ``C`` lower-triangular, Toeplitz and banded (C[t, t-k] = c_k for k < b, else 0),
forward substitution of ``C y = z`` gives

    y_t = (z_t - sum_{k=1}^{b-1} c_k y_{t-k}) / c_0,

so a run keeps its last b - 1 noise trees and nothing else (Choquette-Choo et al., "(Amplified)
Banded Matrix Factorization", NeurIPS 2023, arXiv:2306.08153). b = 1 is DP-FedAvg's fresh noise.

The coefficients are the banded square root of ``A`` (Kalinin & Lampert 2024, arXiv:2405.13763):
``A^(1/2)`` is Toeplitz with c_k = binom(2k, k) / 4^k, the series of (1 - x)^(-1/2) (Fichtenberger
et al. 2023, arXiv:2202.11205), kept for k < b and divided by sqrt(sum_{k<b} c_k^2), the norm of
the longest column, so that no column's norm exceeds 1 and sensitivities are in clip bounds.

Sensitivity. Under b-min-separation (a client takes part at most once in any b consecutive rounds)
a client's rounds t_1 < t_2 < ... touch disjoint rows of ``C``, so ``||C u||^2 = sum_j
||C e_{t_j}||^2``; column norms only shrink with t, so the worst client takes part at 0, s, 2s, ...

Accounting. Cyclic Poisson sampling (clients in b fixed groups, group t mod b eligible in round t,
each eligible client sampled with probability q) amplifies: the run is ceil(T / b) Poisson-subsampled
Gaussian mechanisms (Choquette-Choo et al. 2023, Theorem 4); see ``banded_event``.

Usage:
    coefficients, history = band_coefficients(bands=4), []
    for round_num in range(num_rounds):   # fresh: z_t ~ N(0, s^2 I), drawn from (seed, round_num)
        y = correlated(fresh, history, coefficients)    # added to the round's sum in place of z_t
        history = kept(history, y, bands=4)             # what a checkpoint keeps
    event = banded_event(noise_multiplier, rate, num_rounds, bands=4)

The clients' groups and their cyclic Poisson sampling are ``raysim.sampling``'s
(``cyclic_groups``, ``sample_cyclic_poisson``): every random choice of a run is drawn there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch
from dp_accounting import dp_event

from raysim.params import tree_map
from raysim.types import Tree

T = TypeVar("T", bound=Tree)  # a tree of torch tensors: the structure of a round's sum


def band_coefficients(bands: int) -> np.ndarray:
    """c_0..c_{b-1} of the banded square root of the prefix-sum matrix, column-normalised.

    c_k = binom(2k, k) / 4^k over sqrt(sum_{k<b} binom(2k, k)^2 / 16^k): the longest column of a run
    of at least ``bands`` rounds has norm 1, every other column less.

    Raises:
        ValueError: ``bands`` < 1.
    """
    _check_positive("bands", bands)
    k = np.arange(1, bands)
    # binom(2k, k) / 4^k = prod_{j<=k} (2j - 1) / (2j): no big integers for thousands of bands
    raw = np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])
    return raw / np.linalg.norm(raw)


def sensitivity(coefficients: np.ndarray, num_rounds: int, min_separation: int) -> float:
    """The largest ``||C u||`` over one client's participations u, in clip bounds.

    ``C`` is the ``num_rounds`` x ``num_rounds`` banded Toeplitz matrix of ``coefficients``; a
    client's rounds are at least ``min_separation`` apart. With ``min_separation`` >= the number of
    bands their columns do not overlap: the worst client takes part at 0, s, 2s, ... and the answer
    is the root of the sum of those columns' squared norms. With ``min_separation`` 1 (every round)
    and non-negative coefficients it is ``||C 1||``.

    Raises:
        ValueError: ``num_rounds`` or ``min_separation`` < 1, no coefficients, or 1 < ``min_separation``
            < the number of bands (overlapping columns: no closed form here).
    """
    _check_positive("num_rounds", num_rounds)
    _check_positive("min_separation", min_separation)
    c = np.asarray(coefficients, dtype=np.float64)
    bands = len(c)
    if c.ndim != 1 or bands == 0:
        raise ValueError(f"coefficients: need a non-empty vector, got shape {c.shape}")
    if min_separation >= bands:
        starts = np.arange(0, num_rounds, min_separation)
        rows = np.minimum(bands, num_rounds - starts)  # column t holds c_0..c_{min(b, T-t)-1}
        column_norms2 = np.cumsum(c**2)[rows - 1]
        return float(np.sqrt(column_norms2.sum()))
    if min_separation == 1 and (c >= 0).all():
        # C >= 0 entrywise: adding a participation never shrinks ||C u||, so all rounds is the worst
        row_sums = np.cumsum(c)[np.minimum(np.arange(num_rounds), bands - 1)]
        return float(np.linalg.norm(row_sums))
    raise ValueError(
        f"min_separation: {min_separation} is below the {bands} bands (and not 1), so one client's "
        f"columns overlap; use a separation of at least {bands}"
    )


def correlated(fresh: T, history: Sequence[T], coefficients: Sequence[float] | np.ndarray) -> T:
    """This round's noise y_t = (z_t - sum_{k>=1} c_k y_{t-k}) / c_0; pure, inputs untouched.

    Args:
        fresh: z_t, this round's i.i.d. Gaussian draw, a tree of tensors.
        history: the earlier noise trees y, most recent last, at most ``len(coefficients) - 1``
            of them (fewer in the first rounds: y before round 0 is zero).
        coefficients: c_0..c_{b-1}.

    Raises:
        ValueError: ``history`` is longer than b - 1 (it was kept for more bands).
    """
    c = [float(x) for x in coefficients]
    if len(history) > len(c) - 1:
        raise ValueError(
            f"history: {len(history)} noise trees kept, but {len(c)} bands use at most {len(c) - 1}"
        )
    recent = list(reversed(history))  # y_{t-1}, y_{t-2}, ...: paired with c_1, c_2, ...

    def combine(z: torch.Tensor, *earlier: torch.Tensor) -> torch.Tensor:
        out = z.clone()  # one model-sized buffer, updated in place: the caller's trees stay as they were
        for c_k, y in zip(c[1:], earlier):
            out.sub_(y.to(out), alpha=c_k)
        return out.div_(c[0])

    return tree_map(combine, fresh, *recent)


def kept(history: Sequence[T], noise: T, bands: int) -> list[T]:
    """The history after this round: the last b - 1 noise trees, most recent (``noise``) last."""
    _check_positive("bands", bands)
    window = [*history, noise]
    return window[max(0, len(window) - (bands - 1)) :]


def banded_event(noise_multiplier: float, rate: float, num_rounds: int, bands: int) -> dp_event.DpEvent:
    """The privacy of BandMF with cyclic Poisson sampling: ceil(T / b) subsampled Gaussians.

    Relies on Theorem 4 of Choquette-Choo et al. 2023 (arXiv:2306.08153): with ``C`` b-banded and
    lower-triangular and clients sampled by ``sample_cyclic_poisson`` over fixed ``cyclic_groups``,
    BandMF is as private as DP-SGD with Poisson rate q for ceil(T / b) steps at noise multiplier
    noise_multiplier / (max column norm of C). ``band_coefficients`` makes that norm 1 (below 1 for
    a run shorter than b rounds, where this event overstates epsilon). Neighbouring runs differ by
    one client's presence (``ADD_OR_REMOVE_ONE``), whose clipped update is bounded by the clip bound.

    Raises:
        ValueError: ``noise_multiplier`` < 0, ``rate`` outside (0, 1], ``num_rounds`` or ``bands`` < 1.
    """
    _check_noise(noise_multiplier)
    _check_rate(rate)
    _check_positive("num_rounds", num_rounds)
    _check_positive("bands", bands)
    subsampled = dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(noise_multiplier))
    return dp_event.SelfComposedDpEvent(subsampled, math.ceil(num_rounds / bands))


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name}: must be at least 1, got {value}")


def _check_rate(rate: float) -> None:
    if not 0 < rate <= 1:
        raise ValueError(f"rate: the sampling probability must be in (0, 1], got {rate}")


def _check_noise(noise_multiplier: float) -> None:
    if not noise_multiplier >= 0:  # also refuses NaN
        raise ValueError(f"noise_multiplier: must be at least 0, got {noise_multiplier}")
