"""State-dict helpers and tree maps (raysim/params.py)."""

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from raysim import params as P


def test_to_device_turns_array_leaves_into_tensors_and_keeps_the_rest():
    tree = {"c": {"w": np.ones((2, 2), np.float32)}, "anchors": [torch.zeros(3)], "mu": 0.5, "tag": "x"}
    moved = P.to_device(tree, "cpu")
    assert isinstance(moved["c"]["w"], torch.Tensor) and moved["c"]["w"].dtype == torch.float32
    assert torch.equal(moved["c"]["w"], torch.ones(2, 2))
    assert isinstance(moved["anchors"], list) and torch.equal(moved["anchors"][0], torch.zeros(3))
    assert moved["mu"] == 0.5 and moved["tag"] == "x"


@dataclass(frozen=True)
class Update:
    """A plugin update as a small frozen dataclass, as SCAFFOLD sends."""

    delta: dict[str, torch.Tensor]
    weight: torch.Tensor
    norm: float = field(init=False, default=0.0)  # derived: recomputed, never walked

    def __post_init__(self) -> None:
        object.__setattr__(self, "norm", float(self.weight.sum()))


def update(value, weight):
    return Update({"w": torch.full((2,), value), "b": torch.tensor(value)}, torch.tensor(weight))


def test_tree_map_rebuilds_frozen_dataclasses_leaf_by_leaf():
    a, b = update(1.0, 2.0), update(3.0, 5.0)
    total = P.tree_map(lambda x, y: x + y, a, b)
    assert type(total) is Update
    assert torch.equal(total.delta["w"], torch.full((2,), 4.0)) and total.delta["b"].item() == 4.0
    assert total.weight.item() == 7.0 and total.norm == 7.0  # __post_init__ ran on the new values
    with pytest.raises(dataclasses.FrozenInstanceError):
        total.weight = torch.tensor(0.0)
    assert a.weight.item() == 2.0  # the inputs are untouched


def test_tree_map_walks_lists_and_tuples_in_step():
    out = P.tree_map(
        lambda x, y: x * y,
        [torch.tensor(2.0), (torch.tensor(3.0),)],
        [torch.tensor(5.0), (torch.tensor(7.0),)],
    )
    assert isinstance(out, list) and isinstance(out[1], tuple)
    assert out[0].item() == 10.0 and out[1][0].item() == 21.0
    with pytest.raises(ValueError):
        P.tree_map(lambda x, y: x + y, [torch.tensor(1.0)], [torch.tensor(1.0), torch.tensor(2.0)])


def test_num_bytes_counts_every_leaf_of_dataclasses_lists_and_dicts():
    tree = {
        "update": update(1.0, 1.0),
        "anchors": [torch.zeros(3, dtype=torch.float64)],
        "arr": np.zeros(4, np.int16),
    }
    # delta: 2 + 1 float32 (12 bytes), weight: 1 float32 (4), anchors: 3 float64 (24), arr: 4 int16 (8)
    assert P.num_bytes(tree) == 12 + 4 + 24 + 8


def test_to_cpu_and_to_device_walk_dataclasses():
    moved = P.to_device({"u": Update({"w": np.ones(2, np.float32)}, np.array(3.0))}, "cpu")
    assert type(moved["u"]) is Update and isinstance(moved["u"].delta["w"], torch.Tensor)
    assert moved["u"].weight.item() == 3.0 and moved["u"].norm == 3.0
    on_cpu = P.to_cpu([update(2.0, 1.0), "tag", 4])
    assert type(on_cpu[0]) is Update and on_cpu[0].delta["b"].item() == 2.0 and on_cpu[1:] == ["tag", 4]
