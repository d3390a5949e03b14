"""One round of the default protocol, and the metrics it reports."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from raysim import params as P
from raysim.algorithm import pseudo_gradient, pure_aggregate
from raysim.probes import ProbeRound
from raysim.runtime.worker import RoundOptions
from raysim.types import Metrics, Payload, RoundOutput, ServerState

if TYPE_CHECKING:
    from raysim.engine.services import Engine

A = TypeVar("A")  # the algorithm's aggregate type


def run_round(engine: Engine[A], state: ServerState, round_num: int) -> tuple[ServerState, Metrics]:
    """One round: sample, broadcast, train and fold on workers, update the server, probe."""
    t0 = time.perf_counter()
    # 1. Sample the cohort: a pure function of (seed, round_num), or the fixed schedule.
    cohort = engine.cohort(round_num)
    # 2. One payload for every client; each worker folds its clients into one partial.
    payload = engine.algorithm.broadcast(state, round_num)
    probes = engine.due_probes(round_num)
    options = RoundOptions(tuple(probes), any(p.keeps_local_models for p in probes.values()))
    output = engine.train_cohort(payload, cohort, round_num, options)
    # 3. Merge happened in the backend; the server updates from the aggregate.
    new_state, metrics = engine.algorithm.server_update(state, output.aggregate, round_num)
    metrics |= round_metrics(output, payload, len(cohort), time.perf_counter() - t0)
    # 4. Probes due this round summarize what their worker hooks measured.
    if probes:
        metrics |= probe_round(engine, state, new_state, payload, output, round_num)
    return new_state, metrics


def probe_round(
    engine: Engine[A],
    old: ServerState,
    new: ServerState,
    payload: Payload,
    output: RoundOutput[A],
    round_num: int,
) -> Metrics:
    """Each due probe's summary of the round (its rows, the models before and after)."""
    from raysim.engine.services import PluginServices

    grad = pseudo_gradient(engine.algorithm, output.aggregate, old.params)
    view = ProbeRound(
        round_num=round_num,
        rows=[],
        broadcast=payload.params,
        global_params=P.to_numpy(new.params),
        pure_aggregate=P.to_numpy(pure_aggregate(old.params, grad)) if grad is not None else None,
        local_models=output.local_models,
    )
    services = PluginServices(engine)
    metrics: Metrics = {}
    for name, probe in engine.due_probes(round_num).items():
        metrics |= probe.summarize(replace(view, rows=output.probe_rows.get(name, [])), services)
    return metrics


_BOOKKEEPING = frozenset({"client_id", "weight", "seconds"})


def round_metrics(output: RoundOutput[object], payload: Payload, cohort_size: int, seconds: float) -> Metrics:
    """Every client metric averaged over clients (weighted by their weight), and system metrics."""
    clients = output.client_metrics
    total = sum(m["weight"] for m in clients) or 1.0
    keys = sorted({k for m in clients for k in m} - _BOOKKEEPING)
    metrics = {key: sum(m[key] * m["weight"] for m in clients if key in m) / total for key in keys}
    busiest = max(output.worker_seconds, default=0.0)
    mean_busy = float(np.mean(output.worker_seconds)) if output.worker_seconds else 0.0
    return (
        metrics
        | bytes_down(payload, cohort_size)
        | {
            "sys/round_s": seconds,
            "sys/clients_per_s": len(clients) / seconds if seconds > 0 else 0.0,
            "sys/bytes_up": float(output.bytes_up),
            "sys/failed_clients": float(len(output.failures)),
            "sys/worker_imbalance": busiest / mean_busy if mean_busy > 0 else 1.0,
            "sys/worker_busy_s": busiest,  # the slowest worker's time training its clients
            "sys/driver_overhead_s": max(seconds - busiest, 0.0),  # broadcast, transfer, merge, server
            "sys/num_workers": float(len(output.worker_seconds)),
        }
    )


def bytes_down(payload: Payload, cohort_size: int) -> Metrics:
    """What the broadcast weighs over the cohort: in total, and per payload part (the params and
    each ``extra`` key, e.g. FedGuCci's anchors apart from the model)."""
    parts = {"params": P.num_bytes(payload.params)} | {k: P.num_bytes(v) for k, v in payload.extra.items()}
    out = {f"sys/bytes_down/{name}": float(size * cohort_size) for name, size in parts.items()}
    return out | {"sys/bytes_down": float(sum(parts.values()) * cohort_size)}
