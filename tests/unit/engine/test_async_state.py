"""What an asynchronous run's checkpoint keeps (raysim/engine/async_state.py): a clock stopped after
a server step and restored from its saved state (through a weights-only torch file) goes on with
the arrivals of the uninterrupted clock; a checkpoint without that state, or of other settings, is
refused before training."""

from pathlib import Path

import pytest
import torch
from test_async_rounds import three_clients
from test_async_setup import FEDBUFF, job

from raysim.checkpoint import Checkpoint
from raysim.config.asynchrony import AsynchronyConfig
from raysim.engine.async_rounds import server_steps
from raysim.engine.async_state import AsyncRun, open_asynchrony, restore
from raysim.errors import CheckpointError
from raysim.systems.async_clock import AsyncClock
from raysim.types import ServerState

CONFIG = AsynchronyConfig(kind="fedbuff", concurrency=3, buffer_size=2)


def model(version: int) -> ServerState:
    return ServerState({"w": torch.tensor([float(version)])})


def schedule(run: AsyncRun, first: int, steps: int, stop_after: int | None = None) -> list[list[tuple]]:
    """Each step's arrivals (launch, client, version, end); the run's state kept as the loop keeps it."""
    seen = []
    for step, arrived, _ in server_steps(run.clock, 2, first, steps, run.last_end_s):
        seen.append([(f.launch, f.client, f.version, f.end_s) for f in arrived])
        run.versions = run.versions | {step + 1: model(step + 1)}
        run.histogram.update(step - f.version for f in arrived)
        run.last_end_s = arrived[-1].end_s
        if step == stop_after:  # where end_round checkpoints: the step's free slot not yet refilled
            break
    return seen


def test_a_clock_restored_from_its_checkpoint_goes_on_as_the_uninterrupted_one(tmp_path):
    straight = AsyncRun(CONFIG, AsyncClock(three_clients(), 3), {0: model(0)})
    expected = schedule(straight, 0, 7)
    stopped = AsyncRun(CONFIG, AsyncClock(three_clients(), 3), {0: model(0)})
    before = schedule(stopped, 0, 7, stop_after=3)
    torch.save(stopped.state(), tmp_path / "async.pt")
    saved = torch.load(tmp_path / "async.pt", weights_only=True)  # as a checkpoint reads it back
    resumed = AsyncRun(CONFIG, AsyncClock(three_clients(), 3), {4: model(4)})
    restore(resumed, saved, model(4), "final.pt")
    assert resumed.versions.keys() == {f.version for f in resumed.clock.in_flight} | {4}
    assert all(resumed.versions[v].params["w"].item() == v for v in resumed.versions)
    assert before + schedule(resumed, 4, 7) == expected
    assert resumed.histogram == straight.histogram


def checkpoint(asynchrony: object) -> Checkpoint:
    return Checkpoint(Path("final.pt"), model(3), 2, {}, None, None, asynchrony=asynchrony)


def test_a_checkpoint_without_asynchronous_state_is_refused():
    with pytest.raises(CheckpointError, match="final.pt holds no asynchronous state"):
        open_asynchrony(job(), three_clients(), model(3), 3, checkpoint(None))


def test_a_checkpoint_of_other_asynchrony_settings_is_refused():
    run = AsyncRun(CONFIG, AsyncClock(three_clients(), 3), {0: model(0)})
    schedule(run, 0, 3, stop_after=2)
    other = job(engine={"asynchrony": FEDBUFF | {"buffer_size": 3}})
    with pytest.raises(CheckpointError, match="written with engine.asynchrony .* resume it with them"):
        open_asynchrony(other, three_clients(), model(3), 3, checkpoint(run.state()))
