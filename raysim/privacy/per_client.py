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
  on a Poisson sample of the client's examples (each example in with probability ``q = batch_size
  / num_examples``, as the local trainer draws them), one example's gradient clipped to ``C`` and
  noise ``noise_multiplier * C`` on the sum; ``steps`` of them composed by RDP (Abadi et al., CCS
  2016, arXiv:1607.00133; Mironov, Talwar & Zhang 2019, arXiv:1908.10530) under add/remove of one
  example. ``steps`` counts every noised gradient the client took, over all its participations
  (the sum of its ``train/steps``).

Usage:
    epsilon = local_epsilon(job.privacy.local, reports=participations, delta=job.privacy.delta)
    epsilon = sample_epsilon(job.privacy.sample, num_examples=600, batch_size=32, steps=190, delta=1e-5)
"""

from __future__ import annotations

import dp_accounting
from dp_accounting.rdp import RdpAccountant

from raysim.config.privacy import LocalPrivacy, SamplePrivacy

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


def sample_epsilon(
    config: SamplePrivacy, num_examples: int, batch_size: int, steps: int, delta: float
) -> float:
    """The epsilon one client's DP-SGD spends over ``steps`` noised gradients (the module's law).

    Args:
        config: the noise multiplier (the clip bound does not enter: noise is in its units).
        num_examples: the client's examples, each drawn into a step's batch with probability
            ``batch_size / num_examples`` (1 when the client has no more than ``batch_size``).
        batch_size: the expected batch size (``local.batch_size``).
        steps: the noised gradients the client took, over all its participations.
        delta: the guarantee's delta.

    Raises:
        ValueError: ``num_examples`` or ``batch_size`` below 1, or negative ``steps``.
    """
    if num_examples < 1 or batch_size < 1 or steps < 0:
        raise ValueError(
            f"need num_examples, batch_size >= 1 and steps >= 0: {num_examples}, {batch_size}, {steps}"
        )
    q = min(1.0, batch_size / num_examples)
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(config.noise_multiplier))
    return _rdp_epsilon(dp_accounting.SelfComposedDpEvent(step, steps), delta)


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    accountant = RdpAccountant()  # add or remove one: the relation both laws are stated in
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))
