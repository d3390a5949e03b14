"""Independent numpy references for the robust rules and ALIE (tests only): each written from its
paper's definition, with loops where the implementation vectorizes."""

import math

import numpy as np
from scipy.stats import norm


def median(x):
    return np.median(x, axis=0)


def trimmed_mean(x, beta):
    k = math.floor(beta * len(x))
    return np.sort(x, axis=0)[k : len(x) - k].mean(axis=0)


def krum_scores(x, f):
    n = len(x)
    scores = []
    for i in range(n):
        dists = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(dists[: n - f - 2]))
    return np.array(scores)


def multi_krum(x, f, m):
    """The mean of the m rows of lowest score, and their indices (ties to the lower index)."""
    chosen = np.argsort(krum_scores(x, f), kind="stable")[:m]
    return x[chosen].mean(axis=0), sorted(chosen.tolist())


def sum_of_distances(x, alphas, v):
    return float(sum(a * np.linalg.norm(v - row) for a, row in zip(alphas, x)))


def weiszfeld_step(x, alphas, v, nu):
    betas = np.array([a / max(nu, np.linalg.norm(v - row)) for a, row in zip(alphas, x)])
    return (betas[:, None] * x).sum(0) / betas.sum()


def norm_bounded_mean(x, weights, bound):
    rows = [row * min(1.0, bound / np.linalg.norm(row)) for row in x]
    return np.average(rows, axis=0, weights=weights)


def centered_clip(x, start, tau, iterations):
    v = np.array(start, dtype=np.float64)
    for _ in range(iterations):
        steps = []
        for row in x:
            diff = row - v
            steps.append(diff * min(1.0, tau / np.linalg.norm(diff)))
        v = v + np.mean(steps, axis=0)
    return v


def alie_z(n, f):
    """Baruch et al. 2019, Alg. 3: s = floor(n/2 + 1) - f; z = Phi^-1((n - s) / n)."""
    s = math.floor(n / 2 + 1) - f
    return float(norm.ppf((n - s) / n))
