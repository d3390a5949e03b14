"""An untracked sweep's ledger: one JSON line per cell run (the cell, its status, final metrics,
seconds and error) in ``<output_dir>/sweeps/<sweep id>.jsonl``, so that a rerun skips the cells
noted finished. An untracked job's variants are noted alike (``raysim.cli.finished_variants``).

A driver killed while it wrote a line leaves that line torn. A rerun skips it, saying so, and
runs its cell again; the next line it notes starts on a line of its own.

Usage:
    ledger = CellLedger.of(sweep, ".raysim")
    done = ledger.finished_cells(print)
    ledger.note(outcome)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from raysim.config.cells import Sweep
from raysim.types import Metrics

Status = Literal["FINISHED", "FAILED", "KILLED", "STOPPED"]
DONE = ("FINISHED", "STOPPED")  # a rerun skips these: finished, or stopped by the stopping rule


@dataclass(frozen=True)
class CellOutcome:
    """How one cell ended: its run, its last value of each metric, its error if it failed."""

    cell: str
    status: Status
    run_id: str | None = None
    final: Metrics = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""  # one line: the exception's type and message
    details: str = ""  # the traceback of an error that is not raysim's own


@dataclass(frozen=True)
class CellLedger:
    """The outcomes an untracked sweep noted, one JSON line per cell run."""

    path: Path

    @classmethod
    def of(cls, sweep: Sweep, output_dir: str | Path) -> CellLedger:
        return cls(Path(output_dir) / "sweeps" / f"{sweep.id}.jsonl")

    def finished_cells(self, say: Callable[[str], None]) -> set[str]:
        """Cells noted FINISHED or STOPPED on an earlier run; ``say`` gets one warning line when
        torn lines (a driver killed while writing) were skipped."""
        return set(self.finished(say))

    def finished(self, say: Callable[[str], None]) -> dict[str, dict[str, Any]]:
        """``finished_cells`` with each one's record (its outcome as noted: run id, final metrics,
        seconds), the latest where a cell was noted twice."""
        if not self.path.exists():
            return {}
        finished, torn = {}, []
        for number, line in enumerate(self.path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            record = _record(line)
            if record is None:
                torn.append(number)
            elif record["status"] in DONE:
                finished[record["cell"]] = record
        if torn:
            lines = ", ".join(map(str, torn[:5])) + (" ..." if len(torn) > 5 else "")
            say(
                f"warning: {self.path}: skipped {len(torn)} torn line(s) ({lines}), left by a driver "
                "killed while writing; the cells they noted run again"
            )
        return finished

    def note(self, outcome: CellOutcome) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = "" if _ends_a_line(self.path) else "\n"  # never glued onto a torn line
        with self.path.open("a") as ledger:
            ledger.write(start + json.dumps(asdict(outcome), default=str) + "\n")


def _record(line: str) -> dict[str, Any] | None:
    """A line's record; None for a torn one (not a JSON object naming a cell and a status)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("cell"), str) or "status" not in record:
        return None
    return record


def _ends_a_line(path: Path) -> bool:
    """The file is absent, empty, or ends with a newline."""
    try:
        with path.open("rb") as file:
            file.seek(-1, os.SEEK_END)
            return file.read(1) == b"\n"
    except OSError:  # absent, or empty (no byte before its end)
        return True
