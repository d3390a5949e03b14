"""Local DP: each client's update clipped and noised on its own device, before anything leaves it.

The release of one report (Dwork & Roth, "The Algorithmic Foundations of Differential Privacy",
2014, Theorems 3.6 and A.1; the local model of Kasiviswanathan et al., FOCS 2008, arXiv:0803.0924):

    u' = u * min(1, C / ||u||) + z        ||.|| over every float tensor leaf of the update at once
    gaussian:  ||.||_2,  z_i ~ N(0, (noise_multiplier * C)^2)
    laplace:   ||.||_1,  z_i ~ Laplace(noise_multiplier * C)

Local DP protects the client's whole input: any two updates it could send, so the sensitivity is
the clip ball's diameter, ``2 C`` (``raysim.privacy.per_client.local_epsilon`` accounts it). What the
guarantee covers is the update alone: the client's weight (its example count), its train metrics
and ``privacy/local_norm`` (the norm before clipping, for tuning the bound) travel as the
simulation's bookkeeping, not as part of the release.

The noise is drawn on the CPU from a generator seeded by ``raysim.sampling.noise_seed(seed,
round_num, client_id, salt)`` (salt: the job's ``noise_salt``) and moved to the update's device,
so the serial, Ray and vectorized backends add the same noise to the same client. A deployment
draws it from a secure source.

Usage:
    generator = torch.Generator().manual_seed(noise_seed(job.seed, round_num, client_id, salt))
    update, norm = release_update(result.update, job.privacy.local, generator)
    result = release_result(result, job.privacy.local, noise_seed(job.seed, round_num, client_id, salt))
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import torch

from raysim import params as P
from raysim.config.privacy import LocalPrivacy
from raysim.types import ClientResult

T = TypeVar("T")
NORM_METRIC = "privacy/local_norm"  # the update's norm before clipping: for tuning clip_bound


def release_update(update: T, config: LocalPrivacy, generator: torch.Generator) -> tuple[T, float]:
    """``update`` clipped to ``config.clip_bound`` and noised coordinate-wise (the module's law).

    Args:
        update: the client's update: a dict of tensors or a tree of them (``raysim.params``);
            leaves that are not float tensors pass unchanged.
        config: the mechanism, the bound and the noise multiplier.
        generator: a CPU generator; the noise is drawn there, leaf by leaf in tree order, in each
            leaf's dtype (float32 for narrower floats), then moved to the leaf's device.

    Returns:
        The released update, of the same structure, dtypes and devices, and its norm before
        clipping (L2 for gaussian, L1 for laplace).
    """
    clipped, norm = P.clip_tree(update, config.clip_bound, 2 if config.mechanism == "gaussian" else 1)
    noise_scale = config.noise_multiplier * config.clip_bound

    def add_noise(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point():
            return leaf
        dtype = leaf.dtype if leaf.dtype == torch.float64 else torch.float32
        noise = draw_noise(config.mechanism, leaf.shape, dtype, generator) * noise_scale
        return (leaf.to(dtype) + noise.to(leaf.device)).to(leaf.dtype)

    return P.tree_map(add_noise, clipped), float(norm)


def draw_noise(
    mechanism: str, shape: torch.Size, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    """Unit noise on the CPU: N(0, 1), or Laplace(1) as the difference of two Exp(1) draws (the
    generator reaches ``exponential_``; ``torch.distributions.Laplace`` takes none)."""
    if mechanism == "gaussian":
        return torch.randn(shape, generator=generator, dtype=dtype)
    first = torch.empty(shape, dtype=dtype).exponential_(generator=generator)
    return first - torch.empty(shape, dtype=dtype).exponential_(generator=generator)


def release_result(result: ClientResult, config: LocalPrivacy, seed: int) -> ClientResult:
    """``result`` with its update released (``release_update``, the noise seeded by ``seed``, a
    ``noise_seed``) and the norm before clipping among its metrics (``privacy/local_norm``): one
    read back per client."""
    update, norm = release_update(result.update, config, torch.Generator().manual_seed(seed))
    return replace(result, update=update, metrics={**result.metrics, NORM_METRIC: norm})
