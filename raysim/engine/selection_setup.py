"""A job's ``engine.selection`` made into the run's selector (``raysim.selection``), refused where it
cannot apply, and its state saved with a checkpoint and restored from one."""

from __future__ import annotations

from typing import Any

import numpy as np

from raysim.algorithm import AnyAlgorithm, has_protocol, runs_rounds
from raysim.checkpoint import Checkpoint
from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.errors import CheckpointError, ConfigError
from raysim.selection.oort import Oort
from raysim.selection.power_of_choice import PowerOfChoice
from raysim.selection.selector import Selector
from raysim.systems.rounds import SimulatedSystem


def open_selection(
    job: JobConfig,
    store: ClientStore,
    algorithm: AnyAlgorithm[Any],
    system: SimulatedSystem | None,
    checkpoint: Checkpoint | None,
) -> Selector | None:
    """The run's selector (None: uniform, the engine's own draw), drawing the simulated clock's
    cohorts too, and where the run resumes, as the checkpoint left it.

    Raises:
        ConfigError: the algorithm runs its own protocol, whose cohorts no selector picks.
        CheckpointError: the checkpoint holds no selection state to go on from.
    """
    config = job.engine.selection
    if config is None or config.kind == "uniform":
        return None
    if has_protocol(algorithm) or not runs_rounds(algorithm):
        raise ConfigError(
            [
                f"engine.selection: {config.kind} picks the round loop's cohorts, and algorithm "
                f"{job.algorithm.name!r} runs its own protocol; use engine.selection: {{kind: uniform}}"
            ]
        )
    sizes = store.num_examples("train") if system is None else system.fleet.num_examples
    speeds = None if system is None else np.asarray(system.fleet.examples_per_s, np.float64)
    selector: Selector = Oort(config, speeds) if config.kind == "oort" else PowerOfChoice(config.d, sizes)
    if system is not None:
        system.selector = selector
    if checkpoint is not None:
        restore_selection(selector, system, checkpoint.selection, str(checkpoint.path))
    return selector


def saved_selection(selector: Selector | None, system: SimulatedSystem | None) -> dict[str, Any] | None:
    """What a checkpoint keeps of the selection: the selector's state, and the simulated clock's
    rounds, which a resumed run cannot replay without the selector's earlier states."""
    if selector is None:
        return None
    clock = None if system is None else system.ends
    return {"kind": type(selector).__name__, "selector": selector.state(), "clock": clock}


def restore_selection(selector: Selector, system: SimulatedSystem | None, saved: Any, path: str) -> None:
    """The selector (and the clock) as ``saved_selection`` saved them."""
    kind = saved.get("kind") if isinstance(saved, dict) else None
    if kind != type(selector).__name__ or (system is not None and saved.get("clock") is None):
        raise CheckpointError(
            f"{path} holds no engine.selection state (it ran another selection, or uniform): resume it "
            f"with the engine.selection it ran, or start the run afresh"
        )
    selector.restore(saved["selector"])
    if system is not None:
        system.resume(saved["clock"])
