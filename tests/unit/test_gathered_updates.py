"""Every update kept (raysim/gathered_updates.py): flat rows by cohort position, whatever the
grouping of clients into worker partials; the tree ``WeightedMean`` would return rebuilt."""

from dataclasses import dataclass

import pytest
import torch

from raysim.aggregate import WeightedMean
from raysim.gathered_updates import GatheredUpdates, flatten, template_of, unflatten
from raysim.params import tree_map
from raysim.plugin_defaults import round_aggregator
from raysim.types import ClientResult


@dataclass(frozen=True)
class Pair:
    delta: dict
    anchor: torch.Tensor


def update(seed: int) -> Pair:
    g = torch.Generator().manual_seed(seed)
    return Pair(
        {"w": torch.randn(2, 3, generator=g), "b": torch.randn(3, generator=g)}, torch.randn(4, generator=g)
    )


def fold(gather, positions):
    acc = gather.zero()
    for p in positions:
        acc = gather.add(acc, p, ClientResult(update(p), weight=float(p + 1)))
    return acc


def test_flatten_and_unflatten_are_inverse_on_a_tree_of_tensors():
    tree = update(0)
    back = unflatten(flatten(tree), template_of(tree))
    assert isinstance(back, Pair)
    tree_map(lambda a, b: torch.testing.assert_close(a, b), back, tree)
    with pytest.raises(ValueError, match="template of 13"):
        unflatten(torch.zeros(14), template_of(tree))


def test_any_grouping_of_clients_into_partials_gives_the_same_rows():
    gather = GatheredUpdates(WeightedMean())
    one = gather.result(fold(gather, range(5)))
    split = gather.result(
        gather.merge(fold(gather, [4, 1]), gather.merge(fold(gather, [3]), fold(gather, [0, 2])))
    )
    assert one.positions == split.positions == [0, 1, 2, 3, 4]
    assert one.weights == split.weights == [1.0, 2.0, 3.0, 4.0, 5.0]
    for a, b in zip(one.vectors, split.vectors):
        assert torch.equal(a, b)
    assert torch.equal(split.vectors[3], flatten(update(3)))


def test_an_unweighted_mean_plugin_gives_every_row_weight_one():
    gather = GatheredUpdates(WeightedMean(weighted=False))
    assert gather.result(fold(gather, [0, 1])).weights == [1.0, 1.0]


def test_a_kept_row_is_a_copy_of_the_update():
    gather = GatheredUpdates(WeightedMean())
    tree = {"w": torch.ones(3)}
    acc = gather.add(gather.zero(), 0, ClientResult(tree, 1.0))
    tree["w"].add_(1.0)  # the worker's resident model trains on
    assert torch.equal(acc.vectors[0], torch.ones(3))


def test_the_round_aggregator_gathers_only_a_weighted_mean():
    plugin = type("Plugin", (), {"aggregator": lambda self: WeightedMean()})()
    assert isinstance(round_aggregator(plugin, None, gathers=True), GatheredUpdates)
    assert isinstance(round_aggregator(plugin, None), WeightedMean)
