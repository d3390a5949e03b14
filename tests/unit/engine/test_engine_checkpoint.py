"""Engine.checkpoint writes a checkpoint and its client-state snapshot as one: a crash at any
step leaves the old pair or the new one, never a checkpoint beside another round's client state."""

import errno
import multiprocessing
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import raysim.checkpoint
import raysim.engine.checkpoint_writer
import raysim.runtime.client_state
from raysim.checkpoint import read_checkpoint
from raysim.engine.engine import Engine
from raysim.errors import CheckpointError
from raysim.runtime.client_state import ClientStateStore
from raysim.types import ServerState


class Crash(Exception):
    """The forced failure standing in for a driver killed at one step."""


def crash(*args, **kwargs):
    raise Crash


def write(engine, round_num):
    """Client 7 and the model both hold ``round_num`` after it; then the final checkpoint."""
    ClientStateStore(engine.state_dir).put(7, round_num, {"c": torch.tensor([float(round_num)])})
    state = ServerState({"w": torch.tensor([float(round_num)])})
    return Engine.checkpoint(engine, state, round_num, "final.pt")


@pytest.fixture
def engine(tmp_path):
    """Just what Engine.checkpoint reads, its final.pt written once after round 3."""
    fake = SimpleNamespace(
        run_dir=tmp_path / "run",
        state_dir=tmp_path / "run" / "client_state",
        tracker=SimpleNamespace(run_id=None),
        job=SimpleNamespace(to_dict=lambda: {}),
        privacy=None,  # a run without privacy accounting
        selector=None,  # nor a guided selection
        downlink=None,  # nor a compressed broadcast
        asynchrony=None,  # nor clients in flight
        targets=None,  # nor evaluation.time_to_target
        system=None,
    )
    write(fake, 3)
    return fake


def resumed_state(path: Path, tmp_path: Path) -> tuple[int, float, float | None]:
    """(round, model, client 7's state or None) as resuming from ``path`` would see them."""
    found = read_checkpoint(path)
    store = ClientStateStore(tmp_path / "restored")
    store.restore(found.state_dir)
    client = store.get(7, before_round=found.round_num + 1)
    return found.round_num, found.state.params["w"].item(), None if client is None else client["c"].item()


STEPS = {
    "while freezing the snapshot": (raysim.runtime.client_state, "_link_or_copy"),
    "while listing the snapshot's files": (raysim.runtime.client_state, "write_manifest"),
    "while writing the checkpoint file": (raysim.checkpoint.torch, "save"),
    "before the checkpoint replaces the old one": (Path, "replace"),
    "before the old snapshot is dropped": (raysim.engine.checkpoint_writer, "drop_other_snapshots"),
}


_replace = Path.replace


def at(step: str, action):
    """``action`` standing in for the step's function; for the checkpoint's own replace, only
    there (client-state files are put in place with Path.replace too, and must go on)."""
    if STEPS[step] != (Path, "replace"):
        return action

    def replace(self, target):
        if Path(target).name == "final.pt":
            return action()
        return _replace(self, target)

    return replace


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_leaves_a_consistent_checkpoint(tmp_path, engine, step, monkeypatch):
    for round_num in (4, 5):  # the store keeps rounds 4 and 5: round 3's version is gone
        ClientStateStore(engine.state_dir).put(7, round_num, {"c": torch.tensor([float(round_num)])})
    owner, name = STEPS[step]
    with monkeypatch.context() as patched:
        patched.setattr(owner, name, at(step, crash))
        with pytest.raises(Crash):
            Engine.checkpoint(engine, ServerState({"w": torch.tensor([5.0])}), 5, "final.pt")
    round_num, model, client = resumed_state(engine.run_dir / "checkpoints" / "final.pt", tmp_path)
    assert model == client == float(round_num)  # the model and the client state of one round
    assert round_num == (5 if step == "before the old snapshot is dropped" else 3)


def test_a_completed_write_keeps_only_the_new_snapshot(tmp_path, engine):
    write(engine, 5)
    folder = engine.run_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["final.client_state.r5", "final.pt"]
    assert resumed_state(folder / "final.pt", tmp_path) == (5, 5.0, 5.0)


def _exit(*args, **kwargs):
    os._exit(9)


def _torn_save(payload, path, *args, **kwargs):
    Path(path).write_bytes(b"PK\x03\x04 half a checkpoint")
    os._exit(9)


def _write_and_exit_at(engine, step: str) -> None:
    """In a forked child: the round-5 write, the process ending abruptly at ``step`` (os._exit: no
    ``except`` or ``finally`` clean-up runs, as for a driver killed there)."""
    owner, name = STEPS[step]
    setattr(owner, name, _torn_save if step == "while writing the checkpoint file" else at(step, _exit))
    Engine.checkpoint(engine, ServerState({"w": torch.tensor([5.0])}), 5, "final.pt")
    os._exit(0)  # the step was never reached


@pytest.mark.parametrize("step", STEPS)
def test_a_process_ending_abruptly_at_any_step_leaves_a_consistent_checkpoint(tmp_path, engine, step):
    """As the issue's probe did, by a forced exit rather than an exception; the next write then
    leaves only its own pair (a torn .tmp or an orphaned snapshot is not kept)."""
    for round_num in (4, 5):
        ClientStateStore(engine.state_dir).put(7, round_num, {"c": torch.tensor([float(round_num)])})
    child = multiprocessing.get_context("fork").Process(target=_write_and_exit_at, args=(engine, step))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 9
    folder = engine.run_dir / "checkpoints"
    round_num, model, client = resumed_state(folder / "final.pt", tmp_path / "first")
    assert model == client == float(round_num) == (5 if step == "before the old snapshot is dropped" else 3)
    left_a_tmp = step in ("while writing the checkpoint file", "before the checkpoint replaces the old one")
    assert (folder / "final.tmp").exists() == left_a_tmp  # never read: resuming reads final.pt
    write(engine, 6)
    assert sorted(p.name for p in folder.iterdir()) == ["final.client_state.r6", "final.pt"]
    assert resumed_state(folder / "final.pt", tmp_path / "second") == (6, 6.0, 6.0)


def test_a_full_disk_while_freezing_the_snapshot_is_one_named_error_and_keeps_the_old_pair(
    tmp_path, engine, monkeypatch
):
    ClientStateStore(engine.state_dir).put(7, 5, {"c": torch.tensor([5.0])})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    folder = engine.run_dir / "checkpoints"
    with monkeypatch.context() as patched:
        patched.setattr(raysim.runtime.client_state, "_link_or_copy", full)
        with pytest.raises(CheckpointError, match=r"could not write .*final\.pt \(No space left"):
            Engine.checkpoint(engine, ServerState({"w": torch.tensor([5.0])}), 5, "final.pt")
    assert sorted(p.name for p in folder.iterdir()) == ["final.client_state.r3", "final.pt"]
    assert resumed_state(folder / "final.pt", tmp_path) == (3, 3.0, 3.0)
