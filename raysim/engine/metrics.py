"""The metrics every round reports: client metrics averaged over the cohort, and system metrics."""

from __future__ import annotations

import numpy as np

from raysim import params as P
from raysim.measure.pooling import weighted_means
from raysim.stored import plain
from raysim.types import Metrics, Payload, RoundOutput

_BOOKKEEPING = frozenset({"client_id", "weight", "seconds"})


def round_metrics(output: RoundOutput[object], payload: Payload, cohort_size: int, seconds: float) -> Metrics:
    """Every client metric averaged, weighted by client weight, over the clients that report it;
    and system metrics."""
    clients = output.client_metrics
    metrics = weighted_means(clients, "weight", _BOOKKEEPING)
    busy = [times.busy_s for times in output.worker_times]
    busiest = max(busy, default=0.0)
    mean_busy = float(np.mean(busy)) if busy else 0.0
    return (
        metrics
        | bytes_down(payload, cohort_size)
        | {
            "sys/round_s": seconds,
            "sys/clients_per_s": len(clients) / seconds if seconds > 0 else 0.0,
            "sys/bytes_up": float(output.bytes_up),
            "sys/failed_clients": float(len(output.failures)),  # dropped, non-finite ones included
            "sys/nonfinite_clients": float(sum(f.stage == "update_check" for f in output.failures)),
            "sys/worker_imbalance": busiest / mean_busy if mean_busy > 0 else 1.0,
            "sys/worker_busy_s": busiest,  # the slowest worker's time training its clients
            "sys/driver_overhead_s": max(seconds - busiest, 0.0),  # broadcast, transfer, merge, server
            "sys/num_workers": float(len(busy)),
        }
    )


def bytes_down(payload: Payload, cohort_size: int) -> Metrics:
    """What the broadcast weighs over the cohort: in total, and per payload part (the params and
    each field of the plugin's ``extra``, e.g. FedGuCci's anchors apart from the model, once per
    client; the clients' own parts, ``per_client``, each once)."""
    extra = plain(payload.extra)  # the dict of the extra's fields
    fields = extra.items() if isinstance(extra, dict) else []
    parts = {"params": P.num_bytes(payload.params)} | {k: P.num_bytes(v) for k, v in fields}
    out = {f"sys/bytes_down/{name}": float(size * cohort_size) for name, size in parts.items()}
    own = sum(P.num_bytes(part) for part in payload.per_client.values())  # each to its client alone
    if payload.per_client:
        out["sys/bytes_down/per_client"] = float(own)
    return out | {"sys/bytes_down": float(sum(parts.values()) * cohort_size + own)}
