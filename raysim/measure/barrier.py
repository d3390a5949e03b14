"""The probes of a round's clients: the client-server barrier (FedFish) and local accuracy."""

from __future__ import annotations

import numpy as np

from raysim.measure import scores
from raysim.measure.pooling import pool_rows
from raysim.probe import ClientView, ProbeConfig, ProbeRound
from raysim.registry import register
from raysim.services import EVALUATE, MapRequest, Services
from raysim.types import Metrics


class BarrierConfig(ProbeConfig, frozen=True, extra="forbid"):
    pure_aggregate: bool = True  # also the barrier of the aggregate before the server optimizer


@register("probe", "client_server_barrier")
class ClientServerBarrier:
    """FedFish's client-server barrier (eq. 5): what aggregation loses on each client's own data.

    On a due round each client's round data is evaluated under its local model (worker) and
    under the new global model (driver, spread over the workers):
    ``barrier/loss = mean_i(L_i(global) - L_i(local_i))``, ``barrier/error = mean_i(acc_i(local_i)
    - acc_i(global))`` (absolute differences; no ``error`` for a regression task), unweighted over
    the cohort; lower is better, 0 means aggregation lost nothing. The server optimizer moves the
    model after aggregating (server Adam's steps have a size of their own), so ``barrier/pure/*``
    measures the aggregate alone, server SGD with lr 1 on the pseudo-gradient, as
    the FedFish paper runs its server (Dhawan et al. 2024, arXiv:2311.10291).
    """

    Config = BarrierConfig
    keeps_local_models = False

    def __init__(self, config: BarrierConfig) -> None:
        self.config = config

    def before_training(self, view: ClientView) -> Metrics:
        return _loss_and_accuracy(view.evaluate(view.data), "start_")

    def after_training(self, view: ClientView) -> Metrics:
        return _loss_and_accuracy(view.evaluate(view.data), "local_")

    def summarize(self, probe_round: ProbeRound, services: Services[object]) -> Metrics:
        points = [probe_round.global_params]
        if self.config.pure_aggregate and probe_round.pure_aggregate is not None:
            points.append(probe_round.pure_aggregate)
        after = services.map_clients(
            MapRequest(
                EVALUATE, points, probe_round.client_ids, split="round", round_num=probe_round.round_num
            )
        )
        metrics = summarize_barrier(probe_round.rows, after[0], "barrier")
        if len(after) > 1:
            metrics |= summarize_barrier(probe_round.rows, after[1], "barrier/pure")
        return metrics


def summarize_barrier(before: list[Metrics], after: list[Metrics | None], scope: str) -> Metrics:
    """The barrier over clients with data: ``before`` holds each client's ``start_*`` and
    ``local_*`` numbers, ``after`` the same data under the aggregated model (same order)."""
    pairs = [(b, a) for b, a in zip(before, after) if a is not None]
    if not pairs:
        return {}

    def mean(values: list[float]) -> float:
        return float(np.mean(values))

    out = {
        f"{scope}/loss": mean([a["loss"] - b["local_loss"] for b, a in pairs]),
        f"{scope}/start_loss": mean([b["start_loss"] for b, _ in pairs]),
        f"{scope}/local_loss": mean([b["local_loss"] for b, _ in pairs]),
        f"{scope}/global_loss": mean([a["loss"] for _, a in pairs]),
    }
    if all("accuracy" in a for _, a in pairs):  # a regression task has none
        out |= {
            f"{scope}/error": mean([b["local_accuracy"] - a["accuracy"] for b, a in pairs]),
            f"{scope}/local_accuracy": mean([b["local_accuracy"] for b, _ in pairs]),
            f"{scope}/global_accuracy": mean([a["accuracy"] for _, a in pairs]),
        }
    return out


def _loss_and_accuracy(row: Metrics, prefix: str) -> Metrics:
    """An evaluation's loss and accuracy (where the task has one), named with ``prefix``."""
    return {f"{prefix}{key}": row[key] for key in ("loss", "accuracy") if key in row}


@register("probe", "local_accuracy")
class LocalAccuracy:
    """Pre-aggregation accuracy: each client's local model on its own test split, before the
    server aggregates (the "Local" numbers FedGuCci and IMA report beside the global model's).

    Logs ``local/test_accuracy`` and ``local/test_loss`` (the examples, tokens for a causal LM, of
    the cohort's clients that have a test split pooled: ``raysim.measure.pooling.pool_rows``), the
    dataset's scores so (``local/test_mcc``: MCC, F1, Pearson, from the summed statistics; no
    accuracy for a regression task), and each one's unweighted mean over clients (``_mean``).
    """

    Config = ProbeConfig
    keeps_local_models = False

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config

    def before_training(self, view: ClientView) -> Metrics:
        return {}

    def after_training(self, view: ClientView) -> Metrics:
        test = view.test_data()
        return view.evaluate(test) if len(test) else {}

    def summarize(self, probe_round: ProbeRound, services: Services[object]) -> Metrics:
        pooled = pool_rows(probe_round.rows)
        if pooled is None:
            return {}
        out: Metrics = {}
        for key in sorted(set(scores.without_sums(pooled)) - {"num_examples"}):
            values = [row[key] for row in probe_round.rows if row.get("num_examples", 0) > 0 and key in row]
            out[f"local/test_{key}"] = pooled[key]
            out[f"local/test_{key}_mean"] = float(np.mean(values))
        return out
