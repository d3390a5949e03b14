"""What one client has spent: the epsilon of local DP over its reports, and of DP-SGD over its steps.

Both guarantees are per client and hold over all of that client's participations, however the
other clients fare; each is computed with dp-accounting (Google, ``dp_accounting`` 0.6).

- Local DP (``raysim.privacy.local_noise``): each report is a Gaussian or Laplace mechanism on an
  update clipped to ``C``. Any two updates the client could send differ by at most the clip ball's
  diameter ``2 C`` (local DP protects the whole input), so a Laplace report at scale
  ``noise_multiplier * C`` is ``2 / noise_multiplier``-DP (Dwork & Roth 2014, Theorem 3.6) and
  ``reports`` of them compose to ``2 reports / noise_multiplier`` (basic composition, Theorem 3.16:
  tight enough for a handful of reports, loose for many). A Gaussian report is the Gaussian
  mechanism at noise multiplier ``noise_multiplier / 2`` over that sensitivity, ``reports`` of them
  composed by Renyi DP (Mironov, CSF 2017, arXiv:1702.07476). No amplification: the client knows
  when it reports, so its participation hides nothing.
- Sample-level DP (DP-SGD, ``raysim.train.dp_sgd``): each step is the sampled Gaussian mechanism
  on a Poisson sample of the examples the client trained on (each in with probability ``q =
  batch_size / examples``, as the local trainer draws them), one example's gradient clipped to
  ``C`` and noise ``noise_multiplier * C`` on the sum; ``steps`` of them composed by RDP (Abadi et
  al., CCS 2016, arXiv:1607.00133; Mironov, Talwar & Zhang 2019, arXiv:1908.10530) under
  add/remove of one example. The counts are the trainer's own (``SampledSteps``): a client that
  trained on different numbers of examples in different rounds (``engine.max_client_examples``
  draws a subset) composes the steps of each rate: dp-accounting's ``ComposedDpEvent`` of one
  ``SelfComposedDpEvent`` per rate. RDP adds over composition, so each rate's one-step RDP is
  computed once (about 86 ms) and scaled by its steps: the accountant's own sum, bit for bit.

Usage:
    epsilon = local_epsilon(job.privacy.local, reports=participations, delta=job.privacy.delta)
    epsilon = sample_epsilon(job.privacy.sample, (SampledSteps(600, 32, 190),), delta=1e-5)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import dp_accounting
import numpy as np
from dp_accounting.rdp import RdpAccountant, compute_epsilon

from raysim.config.privacy import LocalPrivacy, SamplePrivacy

_ORDERS = RdpAccountant().orders  # dp-accounting's default RDP orders
LOCAL_SENSITIVITY = 2.0  # in clip bounds: any two clipped updates are at most 2 C apart


def local_epsilon(config: LocalPrivacy, reports: int, delta: float | None) -> float:
    """The epsilon one client spends on ``reports`` locally private updates (the module's law).

    Args:
        config: the local mechanism.
        reports: the updates the client sent (its participations).
        delta: the guarantee's delta, for gaussian (laplace is pure: ``delta`` is ignored).

    Raises:
        ValueError: a gaussian mechanism without ``delta``, or a negative ``reports``.
    """
    if reports < 0:
        raise ValueError(f"reports must be at least 0, got {reports}")
    if config.mechanism == "laplace":
        return reports * LOCAL_SENSITIVITY / config.noise_multiplier
    if delta is None:
        raise ValueError("local gaussian DP is (epsilon, delta)-DP: set privacy.delta")
    event = dp_accounting.GaussianDpEvent(config.noise_multiplier / LOCAL_SENSITIVITY)
    return _rdp_epsilon(dp_accounting.SelfComposedDpEvent(event, reports), delta)


class SampledSteps(NamedTuple):
    """Noised gradients a client took at one rate: ``steps`` Poisson batches of expected size
    ``batch_size`` drawn from ``examples`` examples (``raysim.train.dp_sgd``'s counts)."""

    examples: int
    batch_size: int
    steps: int


@functools.lru_cache(maxsize=4096)
def sample_epsilon(config: SamplePrivacy, runs: tuple[SampledSteps, ...], delta: float) -> float:
    """The epsilon one client's DP-SGD spends over all its noised gradients (the module's law).

    Cached by its arguments: clients of one size that took the same steps share one computation.

    Args:
        config: the noise multiplier (the clip bound does not enter: noise is in its units).
        runs: the client's steps at each rate, each its own ``examples`` and ``batch_size`` (the
            rate is 1 where the client has no more examples than the batch).
        delta: the guarantee's delta.

    Raises:
        ValueError: a run with ``examples`` or ``batch_size`` below 1, or negative ``steps``.
    """
    rdp = np.zeros(len(_ORDERS), dtype=np.float64)
    for run in runs:
        if run.examples < 1 or run.batch_size < 1 or run.steps < 0:
            raise ValueError(f"need examples, batch_size >= 1 and steps >= 0: {run}")
        if run.steps:
            rdp += run.steps * _step_rdp(config.noise_multiplier, run.examples, run.batch_size)
    return float(compute_epsilon(_ORDERS, rdp, delta)[0])


@functools.lru_cache(maxsize=65536)
def _step_rdp(noise_multiplier: float, examples: int, batch_size: int) -> np.ndarray:
    """One step's RDP at each of the accountant's orders: what ``RdpAccountant`` adds per step of
    a ``SelfComposedDpEvent`` (read-only: the cache hands out this one array)."""
    accountant = RdpAccountant()  # add or remove one example
    step = dp_accounting.PoissonSampledDpEvent(
        min(1.0, batch_size / examples), dp_accounting.GaussianDpEvent(noise_multiplier)
    )
    accountant.compose(step)
    rdp = accountant.rdp
    rdp.flags.writeable = False
    return rdp


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    accountant = RdpAccountant()  # add or remove one: the relation both laws are stated in
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))
