"""Where a round's time goes: the driver's stopwatch over one round, the workers' own phases
folded in, and the per-round metrics and the one-line summary made of them.

A round's wall time (``sys/time/wall_s``, from sampling to the metrics being logged) splits into
``PHASES`` plus ``other``, what none of them accounts for (Ray's scheduling and transfers, the
round's bookkeeping). The driver times its own steps; the workers time theirs
(``raysim.runtime.phase_timer``). Workers that train side by side (Ray) count by the slowest of
them, whom the round waits for; virtual workers that take turns (the serial backend) add up.

Usage:
    timer = RoundTimer(round_num)
    cohort = ...; timer.lap("sampling")
    output = backend.train_cohort(...); timer.add_cohort(output, backend.is_concurrent)
    metrics |= timer.metrics()
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np

from raysim.types import Metrics, RoundOutput, WorkerTimes

Phase = Literal["sampling", "broadcast", "data_loading", "training", "reduce", "server_update", "evaluation"]
PHASES: tuple[Phase, ...] = (
    "sampling", "broadcast", "data_loading", "training", "reduce", "server_update", "evaluation",
)  # fmt: skip
WALL, OTHER = "sys/time/wall_s", "sys/time/other_s"


def phase_key(phase: str) -> str:
    """The metric of a phase (or ``other``): ``sys/time/training_s``."""
    return f"sys/time/{phase}_s"


class RoundTimer:
    """The seconds one round spends per phase, from its creation to ``metrics``."""

    def __init__(self, round_num: int) -> None:
        self.round_num = round_num
        self.started = self._mark = time.perf_counter()
        self.seconds: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        self.workers: Metrics = {}

    def lap(self, phase: Phase | None = None) -> float:
        """Counts the time since the last lap as ``phase`` (None: as other); returns it."""
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        if phase is not None:
            self.seconds[phase] += seconds
        return seconds

    def add(self, phase: Phase, seconds: float) -> None:
        """Counts ``seconds`` measured elsewhere (by a worker, around a call) as ``phase``."""
        self.seconds[phase] += seconds

    def add_cohort(self, output: RoundOutput[object], is_concurrent: bool) -> None:
        """The cohort's training, since the last lap: the phases of the workers the round waited
        for, the driver's merge as reduce, and what each worker did with the time (the rest of the
        wait, transfers and scheduling, stays other)."""
        window = self.lap()
        for phase, seconds in waited_for(output.worker_times, is_concurrent).items():
            self.add(phase, seconds)
        self.add("reduce", output.merge_s)
        self.workers = worker_metrics(output.worker_times, window)

    def metrics(self) -> Metrics:
        """Every phase (zero when it did not happen), other and the wall time so far, the workers'
        utilisation and GPU memory."""
        wall = time.perf_counter() - self.started
        phases = {phase_key(phase): seconds for phase, seconds in self.seconds.items()}
        return phases | {OTHER: max(wall - sum(phases.values()), 0.0), WALL: wall} | self.workers


def waited_for(times: list[WorkerTimes], is_concurrent: bool) -> dict[Phase, float]:
    """The workers' phases the round waited for: the slowest worker's when they ran side by side,
    all of them added up when they took turns."""
    path = [max(times, key=lambda t: t.busy_s)] if is_concurrent and times else times
    return {
        "broadcast": sum(t.broadcast_s for t in path),
        "data_loading": sum(t.data_loading_s for t in path),
        "training": sum(t.training_s for t in path),
        "reduce": sum(t.reduce_s for t in path),
    }


def worker_metrics(times: list[WorkerTimes], window_s: float) -> Metrics:
    """Each worker's utilisation (its busy time over the time the driver waited for the cohort),
    their mean, the straggler spread (slowest minus fastest busy time), and each worker's peak GPU
    memory where it ran on a GPU (none on a CPU: no zero that looks measured)."""
    if not times:
        return {}
    busy = np.array([t.busy_s for t in times])
    utilization = busy / window_s if window_s > 0 else np.ones_like(busy)
    out = {f"sys/worker/{i}/utilization": float(u) for i, u in enumerate(utilization)}
    out |= {"sys/worker_utilization": float(utilization.mean()), "sys/worker_spread_s": float(np.ptp(busy))}
    gpu = {i: t.gpu_max_allocated_bytes for i, t in enumerate(times) if t.gpu_max_allocated_bytes is not None}
    out |= {f"sys/worker/{i}/gpu_max_allocated_bytes": float(b) for i, b in gpu.items()}
    if gpu:
        out["sys/gpu_max_allocated_bytes"] = float(max(gpu.values()))
    return out


def time_shares(history: list[tuple[int, Metrics]]) -> dict[str, float]:
    """Each phase's (and other's) share of the rounds' summed wall time, largest first; empty
    when no round was timed."""
    timed = [m for _, m in history if WALL in m]
    wall = sum(m[WALL] for m in timed)
    if not timed or wall <= 0:
        return {}
    totals = {name: sum(m.get(phase_key(name), 0.0) for m in timed) for name in (*PHASES, "other")}
    return dict(sorted(((name, s / wall) for name, s in totals.items()), key=lambda kv: -kv[1]))


def time_summary(history: list[tuple[int, Metrics]]) -> str | None:
    """One line: ``time per round (mean 1.20 s): training 71%, evaluation 18%, ...``, the phases
    under half a percent left out; None when no round was timed."""
    shares = time_shares(history)
    if not shares:
        return None
    walls = [m[WALL] for _, m in history if WALL in m]
    parts = [f"{name.replace('_', ' ')} {share:.0%}" for name, share in shares.items() if share >= 0.005]
    return f"time per round (mean {np.mean(walls):.2f} s): {', '.join(parts)}"
