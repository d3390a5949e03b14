"""What an asynchronous run keeps between server steps, saved with each checkpoint so that a
resumed run goes on exactly as the uninterrupted one would (docs/systems.md, "Asynchronous FL").

The clock's draws are pure functions of (seed, launch index), so its position is its launch count;
beyond it a checkpoint keeps the clients in flight (each with its start version and times), when
the last step's last report came (its free slot launches then, on the next version), the model
versions those clients started from, and the staleness histogram. The model of the step itself is
the checkpoint's own server state.

Usage:
    run = open_asynchrony(job, system, state, start_round, checkpoint)  # None: a synchronous job
    saved = run.state()                                                  # into the checkpoint
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from raysim.checkpoint import Checkpoint, server_state
from raysim.config import JobConfig
from raysim.config.asynchrony import AsynchronyConfig
from raysim.errors import CheckpointError
from raysim.stored import plain, rebuild
from raysim.systems.async_clock import AsyncClock, Flight
from raysim.systems.rounds import Outcome, SimulatedSystem
from raysim.types import ServerState


@dataclass
class AsyncRun:
    """The clock, the model versions its clients in flight need, and the staleness seen so far."""

    config: AsynchronyConfig
    clock: AsyncClock
    versions: dict[int, ServerState] = field(default_factory=dict)  # version -> the model then
    histogram: Counter[int] = field(default_factory=Counter)  # staleness -> updates folded
    last_end_s: float = 0.0  # when the latest step's last report came: its free slot starts then

    def state(self) -> dict[str, Any]:
        """Plain values for a checkpoint (``save_checkpoint``'s ``asynchrony``)."""
        in_flight = self.clock.in_flight
        needed = {flight.version for flight in in_flight}
        return {
            "config": self.config.model_dump(),
            "launches": self.clock.launches,
            "in_flight": [saved_flight(flight) for flight in in_flight],
            "last_end_s": self.last_end_s,
            "versions": {v: saved_state(s) for v, s in self.versions.items() if v in needed},
            "histogram": dict(self.histogram),
        }


def newest_state_key(run: AsyncRun | None) -> int | None:
    """The newest client-state file a checkpoint freezes: an asynchronous client's state is kept
    under its launch index (``RoundOptions.state_keys``), so every launch so far; None: by round."""
    return None if run is None else run.clock.launches - 1


def open_asynchrony(
    job: JobConfig,
    system: SimulatedSystem | None,
    state: ServerState,
    start_round: int,
    checkpoint: Checkpoint | None,
) -> AsyncRun | None:
    """The run's asynchronous state (None: a synchronous job): fresh, or as ``checkpoint`` left it.

    Raises:
        CheckpointError: the checkpoint holds no asynchronous state, or that of other settings.
    """
    config = job.engine.asynchrony
    if config is None:
        return None
    assert system is not None, "check_asynchrony refuses asynchrony without a system: section"
    run = AsyncRun(config, AsyncClock(system, config.concurrency), {start_round: state})
    if checkpoint is None:
        return run
    saved = checkpoint.asynchrony
    path = checkpoint.path
    if not isinstance(saved, dict) or "in_flight" not in saved:
        raise CheckpointError(
            f"{path} holds no asynchronous state (a synchronous run wrote it, or a raysim before "
            f"asynchronous runs could resume): an asynchronous run cannot go on from it; start it afresh"
        )
    if saved["config"] != config.model_dump():
        raise CheckpointError(
            f"{path} was written with engine.asynchrony {saved['config']}, not {config.model_dump()}: "
            f"its clients in flight follow those settings; resume it with them, or start afresh"
        )
    restore(run, saved, state, str(path))
    return run


def restore(run: AsyncRun, saved: dict[str, Any], state: ServerState, path: str) -> None:
    """``run`` as ``AsyncRun.state`` saved it; ``state`` is the checkpoint's model (the newest version)."""
    flights = [flight_of(row) for row in saved["in_flight"]]
    current = max(run.versions)
    versions = {int(v): typed(state, s, path) for v, s in saved["versions"].items()}
    missing = sorted({f.version for f in flights} - set(versions) - {current})
    if missing:
        raise CheckpointError(f"{path} lacks the model versions {missing} its clients in flight started from")
    run.clock.resume(int(saved["launches"]), flights)
    run.versions = versions | run.versions
    run.histogram = Counter({int(tau): int(n) for tau, n in saved["histogram"].items()})
    run.last_end_s = float(saved["last_end_s"])


def saved_flight(flight: Flight) -> list[Any]:
    """A client in flight as plain values (``flight_of``'s inverse)."""
    f, o = flight, flight.outcome
    return [f.launch, f.client, f.version, f.start_s, f.end_s, o.status, o.seconds, o.steps, f.budget]


def flight_of(row: list[Any]) -> Flight:
    launch, client, version, start_s, end_s, status, seconds, steps, budget = row
    return Flight(launch, client, version, start_s, end_s, Outcome(status, seconds, steps), budget)


def saved_state(state: ServerState) -> dict[str, Any]:
    """A model version as ``save_checkpoint`` keeps a server state."""
    return {
        "params": state.params,
        "opt_state": state.opt_state,
        "extra": plain(state.extra),
        "buffer_keys": sorted(state.buffer_keys),
    }


def typed(like: ServerState, saved: dict[str, Any], path: str) -> ServerState:
    """A saved version with its plugin state rebuilt as ``like``'s type."""
    version = server_state(saved)
    try:
        return replace(version, extra=rebuild(like.extra, version.extra, "a model version"))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
