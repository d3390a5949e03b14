"""A run's checkpoint written: the server state, a snapshot of the client state, and the state of
every part of the run a resume needs (privacy accountant, selector, download, asynchrony, targets).

A crash at any step leaves a checkpoint with its own snapshot: the new snapshot goes under a new
name, then the checkpoint naming it replaces the old one atomically, and only then is the old
snapshot dropped.

Usage:
    path = write_checkpoint(engine, state, round_num)          # checkpoints/round_00007.pt
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from raysim.checkpoint import (
    drop_other_snapshots,
    round_checkpoint_name,
    save_checkpoint,
    snapshot_path,
    unwritten,
)
from raysim.compress.downlink import Downlink
from raysim.config import JobConfig
from raysim.engine.async_state import AsyncRun, newest_state_key
from raysim.engine.evaluation import TimeToTarget
from raysim.engine.selection_setup import saved_selection
from raysim.privacy.run_privacy import RunPrivacy
from raysim.runtime.client_state import ClientStateStore
from raysim.selection.selector import Selector
from raysim.systems.rounds import SimulatedSystem
from raysim.tracking.tracker import Tracker
from raysim.types import ServerState


class Checkpointed(Protocol):
    """What a checkpoint reads of the run (``raysim.engine.engine.Engine`` has it all)."""

    job: JobConfig
    tracker: Tracker
    run_dir: Path
    state_dir: Path
    system: SimulatedSystem | None
    targets: TimeToTarget | None
    privacy: RunPrivacy | None
    selector: Selector | None
    downlink: Downlink | None
    asynchrony: AsyncRun | None


def write_checkpoint(
    engine: Checkpointed, state: ServerState, round_num: int, name: str | None = None
) -> Path:
    """Server state plus a hard-link snapshot of the client state as of ``round_num``; the path."""
    path = engine.run_dir / "checkpoints" / (name or round_checkpoint_name(round_num))
    try:
        target, last_key = snapshot_path(path, round_num), newest_state_key(engine.asynchrony)
        frozen = ClientStateStore(engine.state_dir).snapshot(target, round_num, last_key)
    except OSError as exc:  # a full disk: the old pair stays, as when the checkpoint file fails
        raise unwritten(path, exc) from exc
    run_id, uri = engine.tracker.run_id, getattr(engine.tracker, "uri", None)
    run = {"run_id": run_id, "tracking_uri": uri} if run_id is not None and uri is not None else None
    saved = save_checkpoint(
        path,
        state,
        round_num,
        engine.job.to_dict(),
        None if frozen is None else str(frozen),
        run,
        engine.privacy.state() if engine.privacy is not None else None,
        saved_selection(engine.selector, engine.system),
        engine.downlink.state() if engine.downlink is not None else None,
        engine.asynchrony.state() if engine.asynchrony is not None else None,
        engine.targets.reached_values() if engine.targets is not None else None,
    )
    drop_other_snapshots(saved, keep=frozen)
    return saved
