"""One driver per sweep: a sweep's driver holds ``<output_dir>/sweeps/<sweep id>/driver.lock``, taken
as a run's is (``raysim.tracking.driver_lock``: atomic, naming pid, host and start time).

A second driver of the same sweep is refused, naming the first: the first already runs every
cell as concurrently as the cluster allows, so a second could only run the same cells again
(and end the shared sweep run with its own status). A lock left by a driver that no longer runs
is taken over, and the hold says whose it was, so the sweep's run can be told honestly.

Usage:
    hold = hold_sweep(sweep.id, ".raysim")   # raises RaysimError while another driver runs it
    try: ...
    finally: release_sweep(hold)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raysim.errors import RaysimError
from raysim.tracking.driver_lock import DRIVER_LOCK, claim_run_folder, release_run_folder, this_driver


@dataclass(frozen=True)
class SweepHold:
    """This driver's hold on a sweep: its lock's folder, and the driver whose stale lock it took
    over ("" when there was none)."""

    folder: Path
    dead_driver: str = ""


def hold_sweep(sweep_id: str, output_dir: str | Path) -> SweepHold:
    """Takes the sweep for this driver.

    Raises:
        RaysimError: another driver runs the sweep (its pid, host and the fix named).
    """
    folder = Path(output_dir) / "sweeps" / sweep_id
    folder.mkdir(parents=True, exist_ok=True)
    before = _owner(folder)  # read first: a claim that succeeds over it took it from a dead driver
    held_by = claim_run_folder(folder)
    if held_by is not None:
        raise RaysimError(
            f"sweep {sweep_id} is run by another driver: {held_by}; let it finish (or stop it), "
            "then run the same command again to run the cells it leaves"
        )
    return SweepHold(folder, before if before != this_driver() else "")


def release_sweep(hold: SweepHold) -> None:
    release_run_folder(hold.folder)


def _owner(folder: Path) -> str:
    try:
        return (folder / DRIVER_LOCK).read_text().strip()
    except OSError:  # no lock yet
        return ""
