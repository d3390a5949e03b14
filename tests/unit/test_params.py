"""State-dict helpers and tree maps (raysim/params.py): moving trees to the device; finite checks
over update trees (every NaN or infinity is found, wherever it sits)."""

import dataclasses
import math
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
    """Their sums overflow in their own precision (float32: 1.5e39; float64: 3e308): the check
    must not mistake that for an infinity."""
    big = {
        "w": torch.full((5,), 3.0e38),
        "h": torch.full((2,), 6.0e4, dtype=torch.float16),
        "b": torch.full((3,), 3.0e38, dtype=torch.bfloat16),
        "d": torch.full((3,), 1.0e308, dtype=torch.float64),
    }
    assert P.is_finite(big) and P.nonfinite_names(big) == []


def test_on_the_cpu_a_finite_tree_is_proven_by_its_own_dtype_sums(monkeypatch):
    """The exact per-tensor flags (a float64 sum each, several times slower) are only for a tree
    whose quick sums are not finite."""

    def exact(tree):
        raise AssertionError("the exact check ran on a finite tree")

    monkeypatch.setattr(P, "finite_flag", exact)
    assert P.is_finite(tree())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_plus_and_minus_infinity_together_are_not_finite(dtype):
    both = torch.tensor([math.inf, 1.0, -math.inf], dtype=dtype)  # their sum is NaN, not inf
    assert not P.is_finite({"w": both}) and not P.is_finite({"w": both[:1]})


def test_tensor_leaves_walks_dicts_lists_and_dataclasses_in_order():
    names = [name for name, _ in P.tensor_leaves(tree())]
    assert names == ["delta/1.weight", "delta/1.bias", "dc/1.weight", "window/0", "held/update/steps"]


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


def test_num_values_counts_the_elements_those_bytes_hold_whatever_their_dtype():
    tree = {
        "update": update(1.0, 1.0),
        "anchors": [torch.zeros(3, dtype=torch.float64)],
        "arr": np.zeros((2, 2), np.int16),
        "stage": 3,  # a plain value is no parameter
    }
    assert P.num_values(tree) == 3 + 1 + 3 + 4


def test_to_cpu_and_to_device_walk_dataclasses():
    moved = P.to_device({"u": Update({"w": np.ones(2, np.float32)}, np.array(3.0))}, "cpu")
    assert type(moved["u"]) is Update and isinstance(moved["u"].delta["w"], torch.Tensor)
    assert moved["u"].weight.item() == 3.0 and moved["u"].norm == 3.0
    on_cpu = P.to_cpu([update(2.0, 1.0), "tag", 4])
    assert type(on_cpu[0]) is Update and on_cpu[0].delta["b"].item() == 2.0 and on_cpu[1:] == ["tag", 4]


# ---- norms ----------------------------------------------------------------------------------------
# By hand: (3, 4) and (12,) make sqrt(9 + 16 + 144) = 13; without the second, 5.


def test_global_norm_is_the_l2_norm_of_all_entries_as_one_vector():
    tree = {"w": torch.tensor([3.0, 4.0]), "bn.running_mean": torch.tensor([12.0])}
    assert P.global_norm(tree) == 13.0  # buffers count unless skipped
    assert P.global_norm(tree, skip={"bn.running_mean"}) == 5.0
    assert P.global_norm({}) == 0.0 and P.global_norm(tree, skip=tree.keys()) == 0.0


def test_global_norm_squares_in_float64():
    """300^2 + 400^2 overflows float16 (max 65504); the norm is still 500."""
    assert P.global_norm({"w": torch.tensor([300.0, 400.0], dtype=torch.float16)}) == 500.0


def test_global_norm_sums_every_slice_of_a_large_tensor_once():
    """A tensor longer than several slices, with a ragged tail: integer entries, so every square
    and every partial sum is exact in float64 and any order of additions gives numpy's integer
    sum exactly; a slice missed or counted twice would change it."""
    rng = np.random.default_rng(0)
    entries = rng.integers(-7, 8, size=3 * P._NORM_SLICE + 15)
    tree = {"w": torch.tensor(entries, dtype=torch.float32).view(-1, 3), "b": torch.tensor([2.0])}
    assert P.global_norm(tree) == math.sqrt(int(np.sum(entries.astype(np.int64) ** 2)) + 4)


def test_global_norm_of_a_large_tensor_equals_a_float64_reference():
    values = torch.randn(2 * P._NORM_SLICE + 17, generator=torch.Generator().manual_seed(0)) * 1e-3
    reference = math.sqrt(float(np.sum(values.numpy().astype(np.float64) ** 2)))
    assert P.global_norm({"w": values}) == pytest.approx(reference, rel=1e-13)


def test_global_norm_leaves_its_input_as_it_was_and_reads_views_in_logical_order():
    """float64 tensors above and below a slice (their squares must not be taken in place), and a
    transposed one above (summed from its logical order): each against numpy's float64 norm."""
    rng = np.random.default_rng(1)
    small, large = rng.normal(size=100), rng.normal(size=P._NORM_SLICE + 3)
    tree = {"small": torch.tensor(small), "large": torch.tensor(large)}
    expected = math.sqrt(float(np.sum(small**2) + np.sum(large**2)))
    assert P.global_norm(tree) == pytest.approx(expected, rel=1e-13)
    assert torch.equal(tree["small"], torch.tensor(small)) and torch.equal(tree["large"], torch.tensor(large))
    grid = rng.normal(size=(3, P._NORM_SLICE // 2)).astype(np.float32)
    transposed = torch.tensor(grid).t()
    reference = math.sqrt(float(np.sum(grid.astype(np.float64) ** 2)))
    assert P.global_norm({"t": transposed}) == pytest.approx(reference, rel=1e-13)


def test_distance_is_the_norm_of_the_difference():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([4.0, 6.0]), "b": torch.tensor([12.0])}
    assert P.distance(a, b) == 13.0 and P.distance(a, b, skip={"b"}) == 5.0
    assert P.distance(a, a) == 0.0


# ---- float leaves, tree norms, clipping: the privacy mechanisms' shared helpers ---------------------
# The references flatten the float leaves with numpy, in float64, and take numpy's norms.


def privacy_tree(scale: float = 1.0) -> dict:
    """Float leaves of three dtypes in a dict, a list and a dataclass, beside an integer tensor and a
    number that are not clipped, normed or noised."""
    g = torch.Generator().manual_seed(0)
    return {
        "w": scale * torch.randn(30, 20, generator=g),
        "b": [scale * torch.randn(20, generator=g).double()],
        "held": Holder({"x": (scale * torch.randn(5, generator=g)).half()}),
        "steps": torch.tensor([3, 4]),
        "mu": 0.5,
    }


def flat(tree: dict) -> np.ndarray:
    parts = [tree["w"], tree["b"][0], tree["held"].update["x"]]
    return np.concatenate([t.double().numpy().ravel() for t in parts])


def test_float_leaves_are_the_float_tensors_in_tree_map_order():
    t = privacy_tree()
    found = P.float_leaves(t)
    assert [x is y for x, y in zip(found, [t["w"], t["b"][0], t["held"].update["x"]], strict=True)] == [
        True
    ] * 3
    assert P.float_leaves({"i": torch.tensor([1]), "a": np.ones(2, np.float32), "n": 1.0}) == []


@pytest.mark.parametrize("ord", [1, 2])
def test_tree_norm_is_numpys_norm_of_every_float_leaf_as_one_vector(ord):
    t = privacy_tree()
    norm = P.tree_norm(t, ord)
    assert isinstance(norm, torch.Tensor) and norm.dim() == 0 and norm.dtype == torch.float64  # not read back
    assert float(norm) == pytest.approx(np.linalg.norm(flat(t), ord), rel=1e-12)
    assert float(P.tree_norm({"i": torch.tensor([5]), "n": 3.0}, ord)) == 0.0
    # squares (and sums) overflow float16 (max 65504), not the norm: it accumulates in float64
    big = {"h": torch.tensor([300.0, 400.0] * 50, dtype=torch.float16)}
    assert float(P.tree_norm(big, ord)) == pytest.approx(
        math.sqrt(50) * 500.0 if ord == 2 else 35000.0, rel=1e-15
    )
    with pytest.raises(ValueError, match="ord must be 1"):
        P.tree_norm(t, 3)


@pytest.mark.parametrize("ord", [1, 2])
@pytest.mark.parametrize("scale", [0.01, 0.1, 10.0, 1000.0])
def test_clip_tree_scales_onto_the_bound_as_numpy_does_and_leaves_a_tree_within_it(ord, scale):
    t, bound = privacy_tree(scale), 3.0
    before = np.linalg.norm(flat(t), ord)
    clipped, norm = P.clip_tree(t, bound, ord)
    assert float(norm) == pytest.approx(before, rel=1e-12)  # the norm before clipping
    factor = min(1.0, bound / before)
    for got, leaf in zip(
        P.float_leaves(clipped), P.float_leaves(t), strict=True
    ):  # within its dtype's rounding
        rtol = 2 * torch.finfo(leaf.dtype).eps
        np.testing.assert_allclose(got.double().numpy(), leaf.double().numpy() * factor, rtol=rtol, atol=0)
    assert np.linalg.norm(flat(clipped), ord) <= bound * (1 + 1e-3)  # each leaf rounded to its dtype
    if before <= bound:  # within the bound: unchanged, bit for bit
        assert torch.equal(clipped["w"], t["w"]) and torch.equal(
            clipped["held"].update["x"], t["held"].update["x"]
        )
    assert [x.dtype for x in P.float_leaves(clipped)] == [torch.float32, torch.float64, torch.float16]
    assert clipped["steps"] is t["steps"] and clipped["mu"] == 0.5 and type(clipped["held"]) is Holder


def test_clip_factor_is_numpys_min_of_one_and_bound_over_norm_and_a_zero_tree_stays_zero():
    norms = np.array([0.0, 0.5, 2.0, 8.0])
    factor = P.clip_factor(torch.from_numpy(norms), 2.0)
    np.testing.assert_allclose(factor.numpy(), [1.0, 1.0, 1.0, 0.25], rtol=1e-15)
    zero, norm = P.clip_tree({"w": torch.zeros(3)}, 1.0)
    assert float(norm) == 0.0 and torch.equal(zero["w"], torch.zeros(3))
