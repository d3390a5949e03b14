"""Finite checks over update trees: every NaN or infinity is found, wherever it sits."""

import math
from dataclasses import dataclass

import pytest
import torch

from raysim import params as P


@dataclass(frozen=True)
class Holder:
    update: dict


def tree(bad=None, value=math.nan):
    """A SCAFFOLD-like update, a list and a dataclass; ``bad`` names the tensor to poison."""
    leaves = {
        "delta/1.weight": torch.ones(3, 2),
        "delta/1.bias": torch.zeros(2),
        "dc/1.weight": torch.full((3, 2), 0.5, dtype=torch.float64),
        "window/0": torch.ones(4, dtype=torch.bfloat16),
        "held/update/steps": torch.tensor([3, 4]),  # an integer tensor is always finite
    }
    if bad is not None:
        leaves[bad] = leaves[bad].clone()
        leaves[bad].view(-1)[-1] = value
    return {
        "delta": {"1.weight": leaves["delta/1.weight"], "1.bias": leaves["delta/1.bias"]},
        "dc": {"1.weight": leaves["dc/1.weight"]},
        "window": [leaves["window/0"]],
        "held": Holder({"steps": leaves["held/update/steps"]}),
        "note": "not a tensor",
        "none": None,
    }


def test_a_finite_tree_is_finite():
    assert P.is_finite(tree()) and P.nonfinite_names(tree()) == []
    assert P.is_finite({}) and P.is_finite(None)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("bad", ["delta/1.weight", "delta/1.bias", "dc/1.weight", "window/0"])
def test_one_nonfinite_element_anywhere_is_found_and_named(bad, value):
    poisoned = tree(bad, value)
    assert not P.is_finite(poisoned)
    assert P.nonfinite_names(poisoned) == [bad]


def test_huge_but_finite_values_are_finite():
    big = {"w": torch.full((5,), 3.0e38), "h": torch.full((2,), 6.0e4, dtype=torch.float16)}
    assert P.is_finite(big)


def test_tensor_leaves_walks_dicts_lists_and_dataclasses_in_order():
    names = [name for name, _ in P.tensor_leaves(tree())]
    assert names == ["delta/1.weight", "delta/1.bias", "dc/1.weight", "window/0", "held/update/steps"]
