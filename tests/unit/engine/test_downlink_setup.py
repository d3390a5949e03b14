"""``compression.download`` made into the run's downlink, and restored from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raysim.checkpoint import Checkpoint
from raysim.config import JobConfig
from raysim.engine.downlink_setup import open_downlink
from raysim.types import Payload, ServerState

BASE = {
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
}
MODEL = {"w": np.arange(4, dtype=np.float32)}


def job(**sections) -> JobConfig:
    return JobConfig.from_dict(BASE | sections)


def checkpoint(downlink: object) -> Checkpoint:
    state = ServerState(params={}, opt_state=None, extra=None, buffer_keys=frozenset())
    return Checkpoint(Path("final.pt"), state, 1, {}, None, None, downlink=downlink)


def test_no_download_section_no_downlink():
    assert open_downlink(job(), None) is None
    assert open_downlink(job(compression={"upload": {"kind": "sign"}}), None) is None


def test_a_resumed_downlink_goes_on_from_the_saved_public_model():
    topk = job(compression={"download": {"kind": "topk", "fraction": 0.25}})
    first = open_downlink(topk, None)
    first.send(Payload(MODEL), 0)
    first.send(Payload({"w": MODEL["w"] + np.array([0, 0, 8, 1], np.float32)}), 1)
    resumed = open_downlink(topk, checkpoint(first.state()))
    assert resumed.public is first.public and resumed.memory is first.memory
    # a checkpoint that broadcast whole: the clients are taken to hold the model it resumes from
    fresh = open_downlink(topk, checkpoint(None))
    assert fresh.public is None and np.array_equal(fresh.send(Payload(MODEL), 2).params["w"], MODEL["w"])
