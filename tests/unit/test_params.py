"""State-dict helpers (raysim/params.py)."""

import numpy as np
import torch

from raysim import params as P


def test_to_device_turns_array_leaves_into_tensors_and_keeps_the_rest():
    tree = {"c": {"w": np.ones((2, 2), np.float32)}, "anchors": [torch.zeros(3)], "mu": 0.5, "tag": "x"}
    moved = P.to_device(tree, "cpu")
    assert isinstance(moved["c"]["w"], torch.Tensor) and moved["c"]["w"].dtype == torch.float32
    assert torch.equal(moved["c"]["w"], torch.ones(2, 2))
    assert isinstance(moved["anchors"], list) and torch.equal(moved["anchors"][0], torch.zeros(3))
    assert moved["mu"] == 0.5 and moved["tag"] == "x"
