"""A worker's stopwatch for the phases of one round (``WorkerTimes``), and its GPU memory peak.

Phases nest: a phase entered inside another pauses the outer one, so each second counts once,
in the innermost phase (a client's data read inside its training counts as data loading).

Usage:
    timer = PhaseTimer(device)            # at the start of a round's call: its peak memory reset
    with timer.phase("training"):
        ...
    report.times = timer.times()
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

from raysim.runtime.memory import gpu_peak, reset_gpu_peak
from raysim.types import WorkerTimes

Phase = Literal["broadcast", "data_loading", "training", "reduce"]
PHASES: tuple[Phase, ...] = ("broadcast", "data_loading", "training", "reduce")


class PhaseTimer:
    """Adds up the seconds spent in each phase from its creation on."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.started = self._mark = time.perf_counter()
        self.seconds: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        self._open: list[Phase] = []
        self.cuda = device if device is not None and device.type == "cuda" else None
        if self.cuda is not None:  # the peak of this round, not of the worker's life
            reset_gpu_peak(self.cuda)

    @contextmanager
    def phase(self, name: Phase) -> Iterator[None]:
        """Counts the time inside the block as ``name`` (apart from the phases nested in it)."""
        self._switch()
        self._open.append(name)
        try:
            yield
        finally:
            self._switch()
            self._open.pop()

    def _switch(self) -> None:
        """The time since the last switch goes to the innermost open phase."""
        now = time.perf_counter()
        if self._open:
            self.seconds[self._open[-1]] += now - self._mark
        self._mark = now

    def times(self) -> WorkerTimes:
        """The phases so far, the time since creation, and the peak GPU memory (None on a CPU)."""
        peak = gpu_peak(self.cuda) if self.cuda is not None else None
        return WorkerTimes(
            busy_s=time.perf_counter() - self.started,
            broadcast_s=self.seconds["broadcast"],
            data_loading_s=self.seconds["data_loading"],
            training_s=self.seconds["training"],
            reduce_s=self.seconds["reduce"],
            gpu_max_allocated_bytes=peak,
        )
