"""Numpy references for the encoders, written from the papers, independent of raysim.compress."""

from __future__ import annotations

import numpy as np


def top_k_indices(x: np.ndarray, k: int) -> set[int]:
    """The flat indices of the k largest magnitudes (distinct magnitudes assumed)."""
    return {int(i) for i in np.argsort(-np.abs(x.ravel()))[:k]}


def qsgd_variance(v: np.ndarray, bits: int) -> float:
    """E||Q(v) - v||^2 exactly: each coordinate is ||v|| / s times a Bernoulli(p) around its lower
    level, p the remainder of |v_i| / ||v|| * s, so its variance is (||v|| / s)^2 p (1 - p)."""
    s = 2**bits - 1
    norm = np.linalg.norm(v)
    r = np.abs(v) / norm * s
    p = r - np.floor(r)
    return float(np.sum((norm / s) ** 2 * p * (1 - p)))


def qsgd_variance_bound(v: np.ndarray, bits: int) -> float:
    """Alistarh et al. 2017, Lemma 3.1: E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2."""
    s, d = 2**bits - 1, v.size
    return float(min(d / s**2, np.sqrt(d) / s) * np.sum(v**2))


def scaled_sign(p: np.ndarray) -> np.ndarray:
    """EF-SGD's compressor (Karimireddy et al. 2019): ||p||_1 / d * sign(p), zero counted as +."""
    return np.abs(p).sum() / p.size * np.where(p >= 0, 1.0, -1.0)


def power_step(m: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One PowerSGD step (Vogels et al. 2019, Alg. 1): P = orth(M Q), Q' = M^T P; returns
    (P Q'^T, Q')."""
    p, _ = np.linalg.qr(m @ q)
    q_new = m.T @ p
    return p @ q_new.T, q_new
