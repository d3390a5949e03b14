"""Malicious clients: who they are, and what they do to their update (docs/robustness.md).

The malicious set is a pure function of (seed, training pool, fraction), like
``raysim.sampling``'s draws: every worker and the driver agree on it without talking. Update
attacks run on the client's worker, after its training, before its update is folded: it sends
``-scale * update`` (sign flip), ``boost * update`` (scaling, model replacement), or Gaussian
noise in its place. ALIE needs the round's benign updates, so it runs on the driver
(``raysim.robust.release``); label flipping acts on the training batches (``flip_labels``).

Usage:
    malicious = malicious_clients(train_pool, 0.3, seed)
    result = attacked_result(result, attack, seed, round_num, client_id)   # a malicious client's
    z = alie_z(n=20, f=6)
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from raysim.config.job import JobConfig
from raysim.config.robust import AttackConfig, Gaussian, Scale, SignFlip
from raysim.params import tree_map
from raysim.sampling import client_seed, split_population
from raysim.types import ClientResult

_MALICIOUS = 0x1F83D9ABFB41BD6B & (2**63 - 1)  # the malicious set: a stream of its own
_GAUSSIAN = 0x5BE0CD19137E2179 & (2**63 - 1)  # a Gaussian attacker's noise, apart from its training


def malicious_clients(train_pool: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """``floor(fraction * len(train_pool) + 0.5)`` clients of the pool (halves round up), a seeded
    choice, ascending."""
    count = math.floor(fraction * len(train_pool) + 0.5)
    order = np.random.default_rng([seed, _MALICIOUS]).permutation(len(train_pool))
    return np.sort(np.asarray(train_pool)[order[:count]]).astype(np.int64)


def job_malicious(job: JobConfig, num_clients: int, kinds: tuple[str, ...]) -> frozenset[int]:
    """The job's malicious clients where its attack is one of ``kinds`` (none otherwise): of the
    training pool (held-out clients never train), as the engine splits it."""
    if job.attack is None or job.attack.kind not in kinds:
        return frozenset()
    pool, _ = split_population(num_clients, job.evaluation.heldout_fraction, job.seed)
    return frozenset(int(c) for c in malicious_clients(pool, job.attack.fraction, job.seed))


def attacked_update(update: Any, attack: AttackConfig, seed: int) -> Any:
    """``update`` as a malicious client sends it (its floating-point tensors changed); ``seed``
    draws a Gaussian attacker's noise. Attacks that act elsewhere leave it as it is."""
    if isinstance(attack, SignFlip):
        return _float_map(lambda t: t * -attack.scale, update)
    if isinstance(attack, Scale):
        return _float_map(lambda t: t * attack.boost, update)
    if isinstance(attack, Gaussian):
        generator = torch.Generator().manual_seed(seed)
        sigma = attack.sigma
        return _float_map(
            lambda t: (torch.randn(t.shape, generator=generator) * sigma).to(t.device, t.dtype), update
        )
    return update


def attacked_result(
    result: ClientResult, attack: AttackConfig, run_seed: int, round_num: int, client_id: int
) -> ClientResult:
    """A malicious client's result with its update attacked (``attacked_update``)."""
    seed = client_seed(run_seed, round_num, client_id) ^ _GAUSSIAN
    return replace(result, update=attacked_update(result.update, attack, seed))


def _float_map(fn: Any, tree: Any) -> Any:
    return tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


def alie_z(n: int, f: int) -> float:
    """Baruch et al. 2019's ``z_max``: with ``s = floor(n / 2 + 1) - f`` the benign clients the
    attackers need on their side, ``z = Phi^-1((n - s) / n)`` (``s`` at least 1)."""
    s = max(n // 2 + 1 - f, 1)
    return NormalDist().inv_cdf((n - s) / n)


def alie_vector(benign: torch.Tensor, z: float) -> torch.Tensor:
    """The coordinate-wise ``mean - z * std`` of the benign rows (n, d) (std unbiased; 0 for one)."""
    rows = benign.to(torch.float64)
    std = rows.std(0) if len(rows) > 1 else torch.zeros_like(rows[0])
    return (rows.mean(0) - z * std).to(torch.float32)


def flip_label_table(num_classes: int, mapping: dict[int, int] | None) -> torch.Tensor:
    """(C,) the label each label becomes: ``C - 1 - y``, or ``mapping``'s (others kept)."""
    if mapping is None:
        return torch.arange(num_classes - 1, -1, -1)
    table = torch.arange(num_classes)
    for source, target in mapping.items():
        table[source] = target
    return table
