"""Evaluation of the global model: on clients' held-out splits and on a central test set, and
the client-server barrier.

Per-client results are summarised as the example-weighted mean (``eval/clients/accuracy``), the
unweighted mean over clients and the distribution over clients (std, 10th/50th/90th percentile).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from raysim import params as P
from raysim.config import PersonalizationConfig
from raysim.types import Metrics, Params


@dataclass(frozen=True)
class EvaluationPlan:
    """Which clients each evaluation looks at; fixed for the whole run."""

    clients: np.ndarray  # training clients whose test splits are evaluated
    heldout: np.ndarray  # clients that never train (empty: none held out)
    transfer: dict[str, np.ndarray] = field(default_factory=dict)  # transfer dataset -> clients
    personalization: PersonalizationConfig | None = None
    personalize_transfer: frozenset[str] = frozenset()
    num_skipped: dict[str, int] = field(default_factory=dict)  # scope -> clients left out


def keep_personalizable(plan: EvaluationPlan, num_train: np.ndarray, num_test: np.ndarray) -> EvaluationPlan:
    """The plan with the personalized clients narrowed to those personalization admits.

    Personalization skips clients below ``min_examples`` (FedFish filters C4 at 4); the plain
    evaluations of the same scope on other rounds must skip them too, or ``eval/heldout/*``
    would average two sets of clients. ``num_train``/``num_test``: examples per client id.
    """
    config = plan.personalization
    if config is None:
        return plan
    name, scope = ("heldout", "eval/heldout") if len(plan.heldout) else ("clients", "eval/clients")
    clients = getattr(plan, name)
    admitted = config.admits(num_train[clients], num_test[clients])
    return replace(plan, **{name: clients[admitted]}, num_skipped={scope: int((~admitted).sum())})


def evaluate_global(
    backend: Any,
    params: Params,
    plan: EvaluationPlan,
    round_num: int | None = None,
    personalize: bool = False,
) -> Metrics:
    """Central, per-client, held-out, personalized and transfer evaluation, as ``eval/...``.

    Personalization and transfer run only when ``personalize`` (they fine-tune per client).
    """
    t0 = time.perf_counter()
    weights = P.to_numpy(params)
    metrics: Metrics = {}
    central = backend.evaluate_central(weights)
    if central is not None:
        metrics |= {f"eval/central/{k}": v for k, v in central.items() if k != "num_examples"}
    if len(plan.clients):
        metrics |= summarize_clients(backend.evaluate_clients(weights, plan.clients, "test"))
    config = plan.personalization if personalize else None
    if len(plan.heldout):
        rows = (
            backend.personalize(weights, plan.heldout, config, round_num)
            if config
            else backend.evaluate_clients(weights, plan.heldout, "test")
        )
        metrics |= summarize_clients(rows, "eval/heldout")
    elif config is not None:  # nobody held out: personalize the evaluated training clients
        metrics |= summarize_clients(
            backend.personalize(weights, plan.clients, config, round_num), "eval/clients"
        )
    metrics |= {f"{scope}/num_skipped_clients": float(n) for scope, n in plan.num_skipped.items()}
    if personalize:
        for name, clients in plan.transfer.items():
            rows = (
                backend.personalize(weights, clients, plan.personalization, round_num, name)
                if plan.personalization and name in plan.personalize_transfer
                else backend.evaluate_clients(weights, clients, "test", round_num, name)
            )
            metrics |= summarize_clients(rows, f"eval/transfer/{name}")
    metrics["sys/eval_s"] = time.perf_counter() - t0
    return metrics


_SPREAD = ("accuracy", "loss")  # metrics whose distribution over clients is reported
_NOT_METRICS = frozenset({"client_id", "num_examples"})


def summarize_clients(per_client: list[Metrics], scope: str = "eval/clients") -> Metrics:
    """Per metric: the example-weighted mean and the unweighted mean over clients (``_mean``);
    for accuracy and loss also the spread over clients (std, 10th / 50th / 90th percentile)."""
    if not per_client:
        return {}
    n = np.array([m["num_examples"] for m in per_client])
    out: Metrics = {f"{scope}/num_clients": float(len(per_client))}
    keys = sorted({k for m in per_client for k in m} - _NOT_METRICS)
    for key in keys:
        values = np.array([m[key] for m in per_client])
        out |= {
            f"{scope}/{key}": float((values * n).sum() / n.sum()),
            f"{scope}/{key}_mean": float(values.mean()),
        }
        if key in _SPREAD:
            out |= {
                f"{scope}/{key}_std": float(values.std()),
                f"{scope}/{key}_p10": float(np.percentile(values, 10)),
                f"{scope}/{key}_p50": float(np.percentile(values, 50)),
                f"{scope}/{key}_p90": float(np.percentile(values, 90)),
            }
    return out


def summarize_barrier(before: list[Metrics], after: list[Metrics]) -> Metrics:
    """Client-server barrier (FedFish, eq. 5), unweighted over the round's cohort.

    ``before`` holds each client's loss and accuracy on its round data under the broadcast model
    (``start_*``) and under its local model (``local_*``); ``after`` the same data under the new
    global model. ``barrier/loss = mean(L_i(global) - L_i(local))`` and ``barrier/error =
    mean(acc_i(local) - acc_i(global))``: lower is better, 0 means aggregation lost nothing.
    """
    new = {int(m["client_id"]): m for m in after}
    pairs = [(b, new[int(b["client_id"])]) for b in before if int(b["client_id"]) in new]
    if not pairs:
        return {}
    mean = lambda values: float(np.mean(list(values)))  # noqa: E731
    return {
        "barrier/loss": mean(g["loss"] - b["local_loss"] for b, g in pairs),
        "barrier/error": mean(b["local_accuracy"] - g["accuracy"] for b, g in pairs),
        "barrier/start_loss": mean(b["start_loss"] for b, _ in pairs),
        "barrier/local_loss": mean(b["local_loss"] for b, _ in pairs),
        "barrier/global_loss": mean(g["loss"] for _, g in pairs),
        "barrier/local_accuracy": mean(b["local_accuracy"] for b, _ in pairs),
        "barrier/global_accuracy": mean(g["accuracy"] for _, g in pairs),
    }
