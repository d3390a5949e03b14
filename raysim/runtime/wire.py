"""What crosses between the driver and a worker: plain values that pickle (Ray ships them).

A worker is built from ``WorkerSetup``; each round it is told ``RoundOptions`` and answers with a
``WorkerReport``; ``map_clients`` sends it a ``MapRequest``. Those two requests are the engine's
verbs' own (``raysim.services``: plugins and probes write them too), checked on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysim.types import ClientFailure, Metrics, NumpyParams, WorkerTimes

if TYPE_CHECKING:
    from raysim.aggregate import Partial


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs to build itself; plain values only (it crosses processes)."""

    job: dict[str, Any]  # JobConfig.to_dict(): the worker re-validates, plugins load locally
    store_path: str
    state_dir: str
    transfer_stores: dict[str, str] = field(default_factory=dict)  # evaluation-only datasets
    device: str = "cpu"
    num_threads: int = 1
    gpu_memory_fraction: float | None = None


@dataclass
class WorkerReport:
    """One worker's answer for one round."""

    partial: Partial
    client_metrics: list[Metrics] = field(default_factory=list)
    failures: list[ClientFailure] = field(default_factory=list)
    probe_rows: dict[str, list[Metrics]] = field(default_factory=dict)
    local_models: dict[int, NumpyParams] = field(default_factory=dict)
    bytes_up: int = 0
    times: WorkerTimes = WorkerTimes()  # where the worker's time went
