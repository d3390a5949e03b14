"""prv-accountant (Gopi, Lee & Wutschitz, NeurIPS 2021, arXiv:2106.02848) behind dp-accounting's
``PrivacyAccountant`` interface, so that ``calibrate_dp_mechanism`` drives it as it drives RDP or PLD.

It accounts Poisson-sampled Gaussians only (the one subsampled mechanism prv-accountant 0.2.0
models); anything else, sampling without replacement included, is refused through dp-accounting's
own ``supports`` / ``UnsupportedEventError``. ``get_epsilon`` is PRV's *upper* bound: the estimate
plus the discretisation's error (``eps_error`` in epsilon, ``delta / 1000`` in delta), so the
guarantee holds despite the numerics.

PRV models the "remove" direction of the add-or-remove pair, ``((1-q) N(0, z^2) + q N(1, z^2),
N(0, z^2))``; dp-accounting's PLD takes the worse of both directions, and the tests check PRV's
bound against it.

Usage:
    round_event = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1))
    eps = PrvAccountant().compose(round_event, 100).get_epsilon(1e-5)
"""

from __future__ import annotations

import math

from dp_accounting import dp_event, privacy_accountant
from prv_accountant import GaussianMechanism, PoissonSubsampledGaussianMechanism, PRVAccountant

_EPS_ERROR = 0.01  # PRV's discretisation error in epsilon: 1% at epsilon 1, at about 1 s for 1000 rounds


class PrvAccountant(privacy_accountant.PrivacyAccountant):
    """Composes Poisson-sampled Gaussian events (ADD_OR_REMOVE_ONE) with prv-accountant."""

    def __init__(self, eps_error: float = _EPS_ERROR) -> None:
        super().__init__(privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE)
        self._eps_error = eps_error
        self._releases: list[tuple[float, float, int]] = []  # (sampling probability, noise multiplier, count)

    def _maybe_compose(
        self, event: dp_event.DpEvent, count: int, do_compose: bool
    ) -> privacy_accountant.PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, dp_event.NoOpDpEvent):
            return None
        if isinstance(event, dp_event.SelfComposedDpEvent):
            return self._maybe_compose(event.event, event.count * count, do_compose)
        if isinstance(event, dp_event.ComposedDpEvent):
            for inner in event.events:
                error = self._maybe_compose(inner, count, do_compose)
                if error is not None:
                    return error
            return None
        if isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(
            event.event, dp_event.GaussianDpEvent
        ):
            if do_compose:
                self._releases.append((event.sampling_probability, event.event.noise_multiplier, count))
            return None
        return self.CompositionErrorDetails(
            invalid_event=event,
            error_message="prv-accountant is wired here for PoissonSampledDpEvent(GaussianDpEvent) only",
        )

    def get_epsilon(self, target_delta: float) -> float:
        releases = [(q, z, n) for q, z, n in self._releases if q > 0 and n > 0]
        if not releases:
            return 0.0
        if any(z == 0 for _, z, _ in releases):
            return math.inf
        prvs = [
            GaussianMechanism(noise_multiplier=z) if q >= 1 else PoissonSubsampledGaussianMechanism(q, z)
            for q, z, _ in releases
        ]
        counts = [n for _, _, n in releases]
        accountant = PRVAccountant(
            prvs=prvs,
            max_self_compositions=counts,
            eps_error=self._eps_error,
            delta_error=target_delta / 1000,
        )
        _, _, upper = accountant.compute_epsilon(target_delta, counts)
        return max(0.0, float(upper))
