"""Estimators on model outputs: IMA's loss decomposition (Zhou et al., "Understanding and
Improving Model Averaging in Federated Learning on Heterogeneous Data", IEEE TMC 2024,
arXiv:2305.07845, Theorem 1 and Fig. 4) and linear CKA (Kornblith et
al., ICML 2019, arXiv:1905.00414), IMA's covariance measure.

Every function takes (n, C) logits and, where it scores them, integer labels; everything is
computed in float64. ``Services.map_clients`` fetches both (``MapRequest(LOGITS, ...)`` and
``MapRequest(LABELS, ...)``).

Usage:
    squared_error(logits, labels).mean()    # IMA's MSE loss
    output_spread([logits_1, logits_2])     # the variance term over two models
    mean_pairwise_cka([logits_1, logits_2, logits_3])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities of (n, C) logits, computed stably in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def squared_error(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per example ``||softmax(f(x)) - onehot(y)||^2``: IMA's MSE loss (Theorem 1), in [0, 2]."""
    p = softmax(logits)
    rows = np.arange(len(p))
    return np.asarray((p**2).sum(axis=-1) - 2 * p[rows, labels] + 1.0)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per example ``-log softmax(f(x))_y`` (natural log), computed stably."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(z - top).sum(axis=-1)) + top[:, 0]
    return np.asarray(log_norm - z[np.arange(len(z)), labels])


def output_spread(logits: Sequence[np.ndarray]) -> float:
    """``mean_x mean_k ||p_k(x) - p_bar(x)||^2`` with ``p_k = softmax`` of model k's outputs and
    ``p_bar`` their mean: the variance term of IMA's eq. (2) in its finite form over the models
    (``mean_k ||p_k - y||^2 = ||p_bar - y||^2 + spread``, example by example)."""
    p = np.stack([softmax(z) for z in logits])  # (K, n, C)
    return float(((p - p.mean(axis=0)) ** 2).sum(axis=-1).mean())


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two representations of the same n inputs (Kornblith et al., ICML 2019,
    arXiv:1905.00414, eq. 5): with column-centred X (n, p) and Y (n, q),
    ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)``; 1 for identical (or rotated, or scaled) ones.
    """
    a = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    b = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    if len(a) != len(b):
        raise ValueError(f"linear_cka: the representations cover {len(a)} and {len(b)} inputs")
    a, b = a - a.mean(axis=0), b - b.mean(axis=0)
    denominator = np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b)
    return float(np.linalg.norm(b.T @ a) ** 2 / denominator) if denominator > 0 else 0.0


def mean_pairwise_cka(logits: Sequence[np.ndarray]) -> float:
    """The mean linear CKA over the pairs of models: IMA's covariance measure (Fig. 4)."""
    pairs = [(i, j) for i in range(len(logits)) for j in range(i + 1, len(logits))]
    if not pairs:
        raise ValueError("mean_pairwise_cka: needs at least two models")
    return float(np.mean([linear_cka(logits[i], logits[j]) for i, j in pairs]))
