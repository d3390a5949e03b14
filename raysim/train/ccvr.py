"""Classifier calibration with virtual representations, CCVR (Luo et al., NeurIPS 2021,
arXiv:2106.05001), as FuseFL calibrates its averaged head (Tang et al., NeurIPS 2024,
arXiv:2410.20380).

Each client sends per class the count, the sum and the sum of outer products of its features, so
that the server pools exact class means and (unbiased) covariances over all clients:
``mu_c = sum_m S_mc / N_c`` and ``Sigma_c = (sum_m Q_mc - N_c mu_c mu_c^T) / (N_c - 1)``, the
textbook form of CCVR's pooled covariance (not the FuseFL authors' code's, which drops the last term). The
server then draws virtual features ~ N(mu_c, Sigma_c) and trains only the head on them with
cross-entropy and plain SGD.

Usage:
    stats = class_statistics(features, labels, num_classes)     # on each client
    head, loss = calibrated_head(head, stats_of_every_client, num_classes, CCVRConfig(), lr=0.01, seed=0)
    # the server's step, in parts: pooled_gaussians, virtual_features, calibrate_head
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field, PositiveInt
from torch import nn

from raysim import params as P


class CCVRConfig(BaseModel, frozen=True, extra="forbid"):
    """CCVR's calibration of FuseFL's averaged head (FuseFL paper, Algorithm 1 line 12).

    The defaults are the authors' code's values."""

    enabled: bool = True  # False: the averaged head as it is, far weaker (docs/papers.md section 5)
    samples_per_class: PositiveInt = 5000
    epochs: PositiveInt = 1
    batch_size: PositiveInt = 128
    lr: float | None = Field(None, gt=0)  # None: the clients' local lr (FuseFL's local.lr)


@dataclass(frozen=True)
class FeatureStats:
    """Per-class sufficient statistics of features, float64: ``count`` (C,), ``total`` (C, D) the
    sums, ``outer`` (C, D, D) the sums of ``f f^T``."""

    count: torch.Tensor
    total: torch.Tensor
    outer: torch.Tensor


def class_statistics(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> FeatureStats:
    """The per-class count, sum and sum of outer products of ``features`` (N, D) by ``labels`` (N,)."""
    f = features.detach().to(torch.float64)
    onehot = nn.functional.one_hot(labels.long(), num_classes).to(torch.float64)  # (N, C)
    return FeatureStats(
        count=onehot.sum(dim=0),
        total=onehot.T @ f,
        outer=torch.einsum("nc,nd,ne->cde", onehot, f, f),
    )


def pooled_gaussians(stats: Sequence[FeatureStats]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each class's mean (C, D) and unbiased covariance (C, D, D) over all clients' features, and
    its count (C,); a class seen once has covariance zero, an unseen one mean and covariance zero."""
    count = torch.stack([s.count for s in stats]).sum(dim=0)
    total = torch.stack([s.total for s in stats]).sum(dim=0)
    outer = torch.stack([s.outer for s in stats]).sum(dim=0)
    n = count.clamp(min=1.0)
    means = total / n[:, None]
    covs = (outer - n[:, None, None] * means[:, :, None] * means[:, None, :]) / (n - 1).clamp(min=1.0)[
        :, None, None
    ]
    return means, covs, count


def virtual_features(
    means: torch.Tensor, covs: torch.Tensor, count: torch.Tensor, per_class: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` draws from N(mu_c, Sigma_c) for every class with examples, float32, and their
    labels: ``mu_c + Sigma_c^(1/2) z``, z standard normal. The root is Sigma_c's symmetric square
    root ``V sqrt(L) V^T`` from its eigendecomposition (negative round-off eigenvalues set to zero),
    so a singular covariance (fewer examples than dimensions) samples in its subspace. That root
    is unique, unlike ``V sqrt(L)``, whose columns carry each eigenvector's arbitrary sign (and any
    basis of a repeated eigenvalue's space): round-off (float32 against float64 features, CPU
    against GPU) flips those and would move every draw; here it moves them by round-off only."""
    xs, ys = [], []
    for c in torch.nonzero(count > 0).flatten().tolist():
        eigenvalues, vectors = torch.linalg.eigh(covs[c])
        root = (vectors * eigenvalues.clamp(min=0.0).sqrt()) @ vectors.T  # symmetric, root @ root == Sigma_c
        z = torch.randn(per_class, means.shape[1], generator=generator, dtype=torch.float64)
        xs.append(means[c] + z @ root)
        ys.append(torch.full((per_class,), c, dtype=torch.int64))
    return torch.cat(xs).float(), torch.cat(ys)


def calibrate_head(
    head: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
) -> float:
    """Trains ``head`` alone on (x, y) with cross-entropy and SGD (no momentum), shuffled batches;
    returns the last epoch's mean loss."""
    optimizer = torch.optim.SGD(head.parameters(), lr=lr)
    head.train()
    mean_loss = float("nan")
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        losses = []
        for start in range(0, len(y), batch_size):
            batch = order[start : start + batch_size]
            loss = nn.functional.cross_entropy(head(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        mean_loss = sum(losses) / len(losses)
    return mean_loss


def calibrated_head(
    head: P.Params, stats: Sequence[FeatureStats], num_classes: int, config: CCVRConfig, lr: float, seed: int
) -> tuple[P.Params, float]:
    """The server's CCVR step: the clients' statistics pooled into class Gaussians, virtual
    features drawn from them (seeded by ``seed``) and the linear ``head`` trained on them; returns
    the calibrated head and the last epoch's mean loss."""
    means, covs, count = pooled_gaussians(stats)
    generator = torch.Generator().manual_seed(seed)
    x, y = virtual_features(means, covs, count, config.samples_per_class, generator)
    linear = nn.Linear(x.shape[1], num_classes)
    P.load_into(linear, head)
    loss = calibrate_head(
        linear, x, y, lr=lr, epochs=config.epochs, batch_size=config.batch_size, generator=generator
    )
    return P.clone(P.model_params(linear)), loss
