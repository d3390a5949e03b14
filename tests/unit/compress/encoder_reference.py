"""Numpy references for the encoders, written from the papers, independent of raysim.compress."""

from __future__ import annotations

from collections.abc import Callable

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


def downlink_rounds(
    models: list[np.ndarray], compress: Callable[[np.ndarray], np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The server's side of bidirectional compression with error feedback (Tang et al. 2019,
    DoubleSqueeze), one tensor: x̂ and e start as the first model and zero; each round t sends
    c = C(x_t - x_{t-1} + e), the clients add it, x̂ += c, and e = x_t - x_{t-1} + e - c.
    Returns (x̂, e) after each round."""
    public, residual, last = models[0].copy(), np.zeros_like(models[0]), models[0]
    out = []
    for x in models:
        v = x - last + residual
        sent = compress(v)
        public, residual, last = public + sent, v - sent, x
        out.append((public, residual))
    return out


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """x with all but its k largest magnitudes zeroed."""
    kept = np.zeros(x.size)
    chosen = sorted(top_k_indices(x, k))
    kept[chosen] = x.ravel()[chosen]
    return kept.reshape(x.shape)
