"""A sweep's cells as concurrent Ray tasks on one cluster (docs/sweeps.md says why not Ray Tune).

Each cell is one task that reserves the cell's share (one worker's CPUs and GPU fraction) and
runs the cell's engine inside it with the serial backend: Ray packs the tasks onto the nodes
and queues the rest, and no cell starts a Ray of its own. A Ray worker process runs one cell at a
time and then the next (its imports are paid once); each cell clears what the last one left.

Early stopping (``raysim.sweep.median_stopping``, ``raysim.sweep.asha_stopping``) runs in one
small actor that every cell reports its metric to.

Usage:
    tasks = [CellTask("fedavg_seed0", partial(run_cell, ...), cpus=1.0, gpus=0.0)]
    run_cell_tasks(tasks, resources, on_done=lambda name, outcome: ...)
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import ray
from ray.exceptions import RayTaskError

from raysim.config import ResourcesConfig
from raysim.config.sweep import StoppingConfig
from raysim.errors import ResourceError
from raysim.runtime.ray_session import init_ray
from raysim.stop_request import note_stop_request
from raysim.sweep.asha_stopping import AshaRule
from raysim.sweep.median_stopping import MedianStoppingRule

CANCEL_GRACE_S = 60.0  # Ctrl-C: how long cancelled cells get to end their MLflow runs KILLED
CANCELLED_EXIT_CODE = 128 + signal.SIGINT  # a cancelled cell's stop request, as Ctrl-C's exit

Reporter = Callable[[int, float], bool]  # (round, metric value) -> stop this cell now


@dataclass(frozen=True)
class CellTask:
    """One cell to run: ``run(reporter)`` in a Ray task reserving ``cpus`` and ``gpus``."""

    name: str
    run: Callable[[Reporter | None], Any]
    cpus: float
    gpus: float


@ray.remote(num_cpus=0)
class _Board:
    """The sweep's stopping rule, shared by every cell of the sweep."""

    def __init__(self, stopping: StoppingConfig) -> None:
        self.rule = stopping_rule(stopping)

    def report(self, cell: str, round_num: int, value: float) -> bool:
        return self.rule.report(cell, round_num, value)


def stopping_rule(stopping: StoppingConfig) -> MedianStoppingRule | AshaRule:
    if stopping.rule == "asha":
        return AshaRule(stopping.mode, stopping.grace_rounds, stopping.reduction_factor)
    return MedianStoppingRule(stopping.mode, stopping.grace_rounds, stopping.min_cells)


@dataclass(frozen=True)
class _BoardReporter:
    board: Any  # the _Board actor's handle
    cell: str

    def __call__(self, round_num: int, value: float) -> bool:
        return bool(ray.get(self.board.report.remote(self.cell, round_num, value)))


def run_cell_tasks(
    tasks: list[CellTask],
    resources: ResourcesConfig,
    on_done: Callable[[str, Any], None],
    stopping: StoppingConfig | None = None,
) -> None:
    """Runs every task concurrently, as the cluster's resources allow; ``on_done(name, result)``
        as each ends, ``result`` being what the task returned or the exception it raised (the others
        go on). Ctrl-C or SIGTERM cancels the cells still running or queued (their runs end KILLED) and
    is raised again.

        Raises:
            ResourceError: a cell needs more CPUs or GPUs than any node of the cluster has.
    """
    init_ray(resources)
    refuse_unfit(tasks)
    board = _Board.remote(stopping) if stopping is not None else None  # type: ignore[attr-defined]
    pending: dict[Any, str] = {}
    for task in tasks:
        remote = _run_task.options(num_cpus=task.cpus, num_gpus=task.gpus, name=task.name)
        reporter = _BoardReporter(board, task.name) if board is not None else None
        pending[remote.remote(task.run, reporter)] = task.name
    try:
        while pending:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            on_done(pending.pop(ready), _outcome(ready))
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM's exit (raysim.cli.driver)
        cancel(list(pending))
        raise


@ray.remote(max_retries=0)  # a failed cell is recorded, not retried
def _run_task(run: Callable[[Reporter | None], Any], reporter: Reporter | None) -> Any:
    return run_interruptibly(run, reporter)


def run_interruptibly(run: Callable[[Reporter | None], Any], reporter: Reporter | None) -> Any:
    """Runs a cell that ``ray.cancel`` stops for sure. Ray cancels a running task by raising
    KeyboardInterrupt through its SIGINT handler, once, and one that lands in a class body built
    by a lazy import (torch's, early in a cell) or in a library's broad ``except`` is lost: the
    cell trained on, and could end FINISHED, after its sweep was stopped. So the handler also
    notes a stop request, which the engine honours at the next client or round end (the run
    then ends KILLED through its own clean-up)."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return run(reporter)

    def cancelled(signum: int, frame: FrameType | None) -> None:
        note_stop_request(CANCELLED_EXIT_CODE)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, cancelled)
    try:
        return run(reporter)
    finally:
        signal.signal(signal.SIGINT, previous)


def _outcome(ref: Any) -> Any:
    """A task's return value, or the exception it raised (a raysim error as itself)."""
    try:
        return ray.get(ref)
    except RayTaskError as exc:  # the cell's own exception, not Ray's wrapper of it
        return exc.cause if isinstance(exc.cause, BaseException) else exc
    except Exception as exc:  # the task's worker died (out of memory, killed), or it was cancelled
        return exc


def cancel(refs: list[Any], grace_s: float = CANCEL_GRACE_S) -> None:
    """Cancels running and queued cells: a running one gets KeyboardInterrupt, so its run ends
    KILLED through its own clean-up; waits up to ``grace_s`` for them, then kills the workers of
    those still running (their runs end KILLED by their sentinels and the sweep's driver)."""
    for ref in refs:
        ray.cancel(ref)
    deadline = time.monotonic() + grace_s
    left = refs
    while left and time.monotonic() < deadline:
        _, left = ray.wait(left, num_returns=len(left), timeout=max(0.0, deadline - time.monotonic()))
    for ref in left:  # stuck where no interrupt lands (a long native call): none trains on
        ray.cancel(ref, force=True)


def refuse_unfit(tasks: list[CellTask]) -> None:
    """One error naming every cell no single node can hold (Ray would queue it forever)."""
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    biggest_cpu = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    biggest_gpu = max((n.get("GPU", 0.0) for n in nodes), default=0.0)

    def fits(task: CellTask) -> bool:
        return any(
            task.cpus <= n.get("CPU", 0.0) + 1e-9 and task.gpus <= n.get("GPU", 0.0) + 1e-9 for n in nodes
        )

    unfit = [task for task in tasks if not fits(task)]
    if unfit:
        first = unfit[0]
        names = ", ".join(t.name for t in unfit[:5]) + (
            f" and {len(unfit) - 5} more" if len(unfit) > 5 else ""
        )
        raise ResourceError(
            f"{len(unfit)} sweep cell(s) do not fit any node ({names}): a cell needs {first.cpus:g} CPU "
            f"and {first.gpus:g} GPU (resources.cpus_per_worker, gpus_per_worker), "
            f"the largest node has {biggest_cpu:g} CPU and {biggest_gpu:g} GPU; lower "
            f"resources.cpus_per_worker or gpus_per_worker"
        )
