"""A trained cohort's metrics, computed here for the round loop and every staged plugin alike
(``Services.round_metrics``), and the round loop's own timing of its round."""

from __future__ import annotations

import numpy as np

from raysim import params as P
from raysim.aggregate import weighted_means
from raysim.stored import plain
from raysim.types import Metrics, Payload, RoundOutput, TrainedClient


def round_metrics(output: RoundOutput[object], payload: Payload) -> Metrics:
    """The clients' own metrics averaged by client weight (``client_means``); what the payload
    weighs over the cohort (``bytes_down``) and what the updates weigh; the clients that failed."""
    return (
        client_means(output.clients)
        | bytes_down(payload, output.cohort_size)
        | {
            "sys/bytes_up": float(output.bytes_up),
            "sys/failed_clients": float(len(output.failures)),  # dropped, non-finite ones included
            "sys/nonfinite_clients": float(sum(f.stage == "update_check" for f in output.failures)),
        }
    )


def round_timing(output: RoundOutput[object], seconds: float) -> Metrics:
    """Where a round loop's round of ``seconds`` went: the clients per second, and the workers'
    balance (each worker's busy time, in ``output.worker_times``)."""
    busy = [times.busy_s for times in output.worker_times]
    busiest = max(busy, default=0.0)
    mean_busy = float(np.mean(busy)) if busy else 0.0
    return {
        "sys/round_s": seconds,
        "sys/clients_per_s": len(output.clients) / seconds if seconds > 0 else 0.0,
        "sys/worker_imbalance": busiest / mean_busy if mean_busy > 0 else 1.0,
        "sys/worker_busy_s": busiest,  # the slowest worker's time training its clients
        "sys/driver_overhead_s": max(seconds - busiest, 0.0),  # broadcast, transfer, merge, server
        "sys/num_workers": float(len(busy)),
    }


def client_means(clients: list[TrainedClient]) -> Metrics:
    """Every metric of the clients, averaged over the clients that report it, weighted by their
    weight (0 where those weights are all 0)."""
    return weighted_means([client.metrics for client in clients], [client.weight for client in clients])


def bytes_down(payload: Payload, cohort_size: int) -> Metrics:
    """What the broadcast weighs over the cohort: in total, and per payload part (the params and
    each field of the plugin's ``extra``, e.g. FedGuCci's anchors apart from the model, once per
    client; the clients' own parts, ``per_client``, each once). The params weigh their encoded
    message where ``compression.download`` encoded them (``Payload.params_bytes``)."""
    extra = plain(payload.extra)  # the dict of the extra's fields
    fields = extra.items() if isinstance(extra, dict) else []
    params = P.num_bytes(payload.params) if payload.params_bytes is None else payload.params_bytes
    parts = {"params": params} | {k: P.num_bytes(v) for k, v in fields}
    out = {f"sys/bytes_down/{name}": float(size * cohort_size) for name, size in parts.items()}
    own = sum(P.num_bytes(part) for part in payload.per_client.values())  # each to its client alone
    if payload.per_client:
        out["sys/bytes_down/per_client"] = float(own)
    return out | {"sys/bytes_down": float(sum(parts.values()) * cohort_size + own)}
