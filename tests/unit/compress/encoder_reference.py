"""Numpy references for the encoders, written from the papers, independent of raysim.compress."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def top_k_indices(x: np.ndarray, k: int) -> set[int]:
    """The flat indices of the k largest magnitudes (distinct magnitudes assumed)."""
    return {int(i) for i in np.argsort(-np.abs(x.ravel()))[:k]}


def buckets(v: np.ndarray, bucket: int) -> list[np.ndarray]:
    """QSGD's buckets (Alistarh et al. 2017, Section 3.1): ``bucket`` consecutive values each, the
    last maybe shorter; 0 the whole vector."""
    flat = v.ravel()
    size = bucket if 0 < bucket < flat.size else flat.size
    return [flat[i : i + size] for i in range(0, flat.size, size)]


def qsgd_variance(v: np.ndarray, bits: int, bucket: int = 0) -> float:
    """E||Q(v) - v||^2 exactly: in each bucket b, each coordinate is ||b|| / s times a Bernoulli(p)
    around its lower level, p the remainder of |v_i| / ||b|| * s, so its variance is
    (||b|| / s)^2 p (1 - p)."""
    s = 2**bits - 1
    total = 0.0
    for b in buckets(v, bucket):
        norm = np.linalg.norm(b)
        r = np.abs(b) / norm * s
        p = r - np.floor(r)
        total += float(np.sum((norm / s) ** 2 * p * (1 - p)))
    return total


def qsgd_variance_bound(v: np.ndarray, bits: int, bucket: int = 0) -> float:
    """Alistarh et al. 2017, Lemma 3.1 in each bucket b of d_b values:
    E||Q(b) - b||^2 <= min(d_b / s^2, sqrt(d_b) / s) ||b||^2."""
    s = 2**bits - 1
    return float(sum(min(b.size / s**2, np.sqrt(b.size) / s) * np.sum(b**2) for b in buckets(v, bucket)))


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
