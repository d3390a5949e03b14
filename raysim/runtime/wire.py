"""What crosses between the driver and a worker: plain values that pickle (Ray ships them).

A worker is built from ``WorkerSetup``; each round it is told ``RoundOptions`` and answers with a
``WorkerReport``; ``map_clients`` sends it a ``MapRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysim.errors import ClientError
from raysim.types import ClientFailure, MapTask, Metrics, NumpyParams

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


@dataclass(frozen=True)
class RoundOptions:
    """What a round measures besides training (the probes due, whether local models are kept),
    and the clients doing only part of their local work: client id -> local steps (batches)."""

    probes: tuple[str, ...] = ()
    keep_local_models: bool = False
    step_budgets: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MapRequest:
    """What ``map_clients`` computes: ``task`` for each parameter point on each client.

    ``clients`` None means the dataset's central test set; ``model`` another model section to
    build (and keep) for the points; ``store`` a transfer dataset's name ("" the training data);
    ``paired``: point ``i`` on client ``i`` only (each client's own model), not every pair.
    """

    task: MapTask
    clients: tuple[int, ...] | None
    split: str = "test"
    round_num: int | None = None
    store: str = ""
    model: dict[str, Any] | None = None
    paired: bool = False


@dataclass
class WorkerReport:
    """One worker's answer for one round."""

    partial: Partial
    client_metrics: list[Metrics] = field(default_factory=list)
    failures: list[ClientFailure] = field(default_factory=list)
    probe_rows: dict[str, list[Metrics]] = field(default_factory=dict)
    local_models: dict[int, NumpyParams] = field(default_factory=dict)
    bytes_up: int = 0
    seconds: float = 0.0


def raise_client_failure(failure: ClientFailure, round_num: int) -> None:
    raise ClientError(failure.client_id, round_num, failure.stage, failure.error) from failure.error
