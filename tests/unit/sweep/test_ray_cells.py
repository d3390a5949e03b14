"""A sweep whose cells no node can hold is refused before any starts, naming them and the fix."""

import pytest

from raysim.errors import ResourceError
from raysim.sweep import ray_cells
from raysim.sweep.ray_cells import CellTask, refuse_unfit

NODES = [
    {"Alive": True, "Resources": {"CPU": 4.0}},
    {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
    {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # a dead node holds nothing
]


def task(name, cpus, gpus=0.0):
    return CellTask(name, lambda report: None, cpus, gpus)


def test_cells_that_fit_one_node_pass_and_the_others_are_named(monkeypatch):
    monkeypatch.setattr(ray_cells.ray, "nodes", lambda: NODES)
    refuse_unfit([task("a", 4.0), task("b", 2.0, 1.0), task("c", 1.0, 0.5)])
    with pytest.raises(ResourceError) as info:
        refuse_unfit([task("fits", 1.0), task("big", 5.0), task("gpu", 3.0, 1.0)])
    message = str(info.value)
    assert message.startswith("2 sweep cell(s) do not fit any node (big, gpu)")
    assert "the largest node has 4 CPU and 1 GPU" in message and "lower resources.cpus_per_worker" in message
