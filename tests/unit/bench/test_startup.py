"""The start-up figures of ``raysim bench``: the clock around the job's tracker, a failed command
reported as failed (the benchmark's other figures stand)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console

from raysim.bench.startup import COLUMNS, RoundZeroClock, startup_table, wall_seconds
from raysim.config import load_jobs
from raysim.tracking.tracker import MemoryTracker

QUICKSTART = Path(__file__).resolve().parents[3] / "jobs" / "quickstart.yaml"


def test_the_clock_notes_when_the_run_starts_its_tracker_and_passes_everything_on():
    inner = MemoryTracker()
    clock = RoundZeroClock(inner)
    before = time.time()
    clock.start(load_jobs(QUICKSTART, [], ["fedavg"])[0])
    assert before <= clock.round_0_at <= time.time()
    clock.log_metrics({"m": 1.0}, step=0)
    clock.finish("KILLED")
    assert inner.history == [(0, {"m": 1.0})] and inner.status == "KILLED" and inner.params


def test_a_failed_command_is_none_and_shows_as_failed():
    assert wall_seconds([sys.executable, "-c", "raise SystemExit(3)"]) is None
    assert wall_seconds([sys.executable, "-c", "pass"]) > 0
    figures = dict.fromkeys(COLUMNS, 1.0) | {"first_round_s": None}
    console = Console(width=200, record=True)
    console.print(startup_table(figures))
    shown = console.export_text()
    assert "failed" in shown and "1.00" in shown
