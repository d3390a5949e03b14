"""Evaluation of the global model: on clients' held-out splits and on a central test set.

Per-client results are summarised as the example-weighted mean (``eval/clients/accuracy``), the
unweighted mean over clients and the distribution over clients (std, 10th/50th/90th percentile).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from raysim import params as P
from raysim.types import Metrics, Params


def evaluate_global(backend: Any, params: Params, client_ids: np.ndarray) -> Metrics:
    """Central and per-client evaluation of ``params``, as ``eval/...`` metrics."""
    t0 = time.perf_counter()
    weights = P.to_numpy(params)
    metrics: Metrics = {}
    central = backend.evaluate_central(weights)
    if central is not None:
        metrics |= {f"eval/central/{k}": v for k, v in central.items() if k != "num_examples"}
    if len(client_ids):
        metrics |= summarize_clients(backend.evaluate_clients(weights, client_ids, "test"))
    metrics["sys/eval_s"] = time.perf_counter() - t0
    return metrics


def summarize_clients(per_client: list[Metrics], scope: str = "eval/clients") -> Metrics:
    """Weighted mean, unweighted mean and spread over clients of accuracy and loss."""
    if not per_client:
        return {}
    n = np.array([m["num_examples"] for m in per_client])
    out: Metrics = {f"{scope}/num_clients": float(len(per_client))}
    for key in ("accuracy", "loss"):
        values = np.array([m[key] for m in per_client])
        out |= {f"{scope}/{key}": float((values * n).sum() / n.sum()),
                f"{scope}/{key}_mean": float(values.mean()),
                f"{scope}/{key}_std": float(values.std()),
                f"{scope}/{key}_p10": float(np.percentile(values, 10)),
                f"{scope}/{key}_p50": float(np.percentile(values, 50)),
                f"{scope}/{key}_p90": float(np.percentile(values, 90))}
    return out
