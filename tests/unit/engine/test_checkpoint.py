"""Checkpoints round-trip plain server state and refuse what they could not load back."""

import numpy as np
import pytest
import torch

from raysim.engine.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from raysim.errors import CheckpointError
from raysim.types import ServerState


def test_round_trip(tmp_path):
    state = ServerState(
        {"w": torch.arange(3.0)},
        {"step": 2, "m": {"w": torch.ones(3)}},
        {"window": [torch.zeros(1)]},
        frozenset({"bn"}),
    )
    path = save_checkpoint(tmp_path / "c.pt", state, 4, {"name": "x"}, "/state")
    loaded, round_num, job, state_dir = load_checkpoint(path)
    assert round_num == 4 and job == {"name": "x"} and state_dir == "/state"
    assert torch.equal(loaded.params["w"], state.params["w"]) and loaded.opt_state["step"] == 2
    assert loaded.buffer_keys == frozenset({"bn"})


def test_numpy_in_plugin_state_is_refused_before_writing(tmp_path):
    state = ServerState({"w": torch.zeros(1)}, extra={"anchors": np.zeros(2)})
    with pytest.raises(TypeError, match=r"ServerState\['extra'\]\['anchors'\] is a numpy.ndarray"):
        save_checkpoint(tmp_path / "c.pt", state, 0, {})
    assert not (tmp_path / "c.pt").exists()


def test_unreadable_and_incompatible_checkpoints(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable raysim checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(CheckpointError, match="does not fit"):
        check_compatible(ServerState({"w": torch.zeros(2)}), {"w": torch.zeros(3)}, "c.pt")
