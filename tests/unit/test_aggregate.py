"""Aggregators against hand-computed values, and associativity across groupings."""

import pickle
from dataclasses import dataclass

import pytest
import torch

from raysim.aggregate import Gather, Sum, WeightedMean, merged_result, placed
from raysim.types import ClientResult


def result(value, weight):
    return ClientResult(
        update={"w": torch.tensor([value, 2 * value]), "nested": {"b": torch.tensor(value)}}, weight=weight
    )


def fold(agg, results, start=0):
    acc = agg.zero()
    for i, r in enumerate(results):
        acc = agg.add(acc, start + i, r)
    return acc


def test_weighted_mean_matches_hand_computation():
    # (1*1 + 3*2 + 5*1) / (1 + 2 + 1) = 12 / 4 = 3
    agg = WeightedMean()
    out = agg.result(fold(agg, [result(1.0, 1), result(3.0, 2), result(5.0, 1)]))
    assert torch.allclose(out["w"], torch.tensor([3.0, 6.0]))
    assert out["nested"]["b"].item() == pytest.approx(3.0)
    assert out["w"].dtype == torch.float32


def test_unweighted_mean_ignores_weights():
    agg = WeightedMean(weighted=False)
    out = agg.result(fold(agg, [result(1.0, 100), result(3.0, 1)]))
    assert out["w"][0].item() == pytest.approx(2.0)


def test_merge_of_partials_equals_one_fold():
    agg = WeightedMean()
    results = [result(float(i), i + 1) for i in range(5)]
    whole = agg.result(fold(agg, results))
    left, right = fold(agg, results[:2]), fold(agg, results[2:], start=2)
    split = agg.result(agg.merge(agg.merge(agg.zero(), left), right))
    assert torch.equal(whole["w"], split["w"])


def test_empty_aggregate_is_none():
    assert WeightedMean().result(WeightedMean().zero()) is None
    assert Sum().result(Sum().zero()) is None


def test_sum_adds_updates_without_weighting():
    agg = Sum()
    out = agg.result(fold(agg, [result(1.0, 10), result(2.5, 3)]))
    assert torch.allclose(out["w"], torch.tensor([3.5, 7.0]))


def test_gather_orders_by_cohort_position_whatever_the_merge_order():
    agg = Gather()
    a = agg.add(agg.zero(), 2, result(2.0, 1))
    b = agg.add(agg.add(agg.zero(), 0, result(0.0, 1)), 1, result(1.0, 1))
    out = agg.result(agg.merge(a, b))
    assert [p for p, _ in out] == [0, 1, 2]
    assert [r.update["nested"]["b"].item() for _, r in out] == [0.0, 1.0, 2.0]


def test_gather_keeps_copies_not_views_of_a_reused_tensor():
    agg = Gather()
    shared = torch.zeros(2)
    acc = agg.zero()
    for i in range(3):
        shared.fill_(float(i))  # like a resident model the next client overwrites
        acc = agg.add(acc, i, ClientResult({"w": shared}, 1.0))
    assert [r.update["w"][0].item() for _, r in agg.result(acc)] == [0.0, 1.0, 2.0]


@dataclass(frozen=True)
class Pair:
    """An update as a small frozen dataclass (SCAFFOLD's shape): the tree functions walk it."""

    delta: dict[str, torch.Tensor]
    dc: torch.Tensor


def pair(value, weight):
    return ClientResult(update=Pair({"w": torch.tensor([value])}, torch.tensor(-value)), weight=weight)


def test_sum_and_weighted_mean_fold_dataclass_updates_field_by_field():
    # Sum: 1 + 3 + 5 = 9 (and -9); weighted mean: (1*1 + 3*2 + 5*1) / 4 = 3 (and -3)
    results = [pair(1.0, 1), pair(3.0, 2), pair(5.0, 1)]
    total = Sum().result(fold(Sum(), results))
    assert isinstance(total, Pair) and total.delta["w"].item() == 9.0 and total.dc.item() == -9.0
    assert total.dc.dtype == torch.float32
    mean = WeightedMean().result(fold(WeightedMean(), results))
    assert isinstance(mean, Pair) and mean.delta["w"].item() == pytest.approx(3.0)
    assert mean.dc.item() == pytest.approx(-3.0)
    agg = Sum()
    split = agg.result(agg.merge(fold(agg, results[:1]), fold(agg, results[1:], start=1)))
    assert torch.equal(split.delta["w"], total.delta["w"]) and torch.equal(split.dc, total.dc)


def test_gather_keeps_numbers_in_updates():
    from raysim.aggregate import Gather
    from raysim.types import ClientResult

    agg = Gather()
    acc = agg.add(agg.zero(), 0, ClientResult({"w": torch.ones(2), "steps": 3, "tag": "a"}, 1.0))
    [(position, result)] = agg.result(acc)
    assert position == 0 and result.update["steps"] == 3 and result.update["tag"] == "a"


def _read_only_copy(partial):
    """``partial`` as a Ray worker's arrives: pickled with its arrays out of band, which come back
    read-only (Ray hands over the object store's memory). Returns it and the out-of-band buffers."""
    buffers = []
    data = pickle.dumps(partial, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers]), buffers


def test_a_partial_pickles_its_sums_out_of_band_as_ray_moves_arrays_without_a_copy():
    agg = WeightedMean()
    partial = fold(agg, [result(1.0, 2), result(3.0, 1)])
    arrived, buffers = _read_only_copy(partial)
    assert len(buffers) == 2  # "w" and "nested.b": no tensor pickled in band
    assert arrived.total["w"].dtype == torch.float64
    assert torch.equal(agg.result(arrived)["w"], agg.result(partial)["w"])


def test_merging_read_only_partials_never_writes_into_them_and_matches_the_float64_sum():
    agg = WeightedMean()
    groups = [[result(1.5, 1), result(2.25, 3)], [result(-4.0, 2)], [result(7.125, 5)]]
    partials = [_read_only_copy(fold(agg, g))[0] for g in groups]
    before = [p.total["w"].clone() for p in partials]
    merged = agg.zero()
    for partial in partials:
        merged = agg.merge(merged, partial)
    out = agg.result(agg.merge(merged, fold(agg, [result(0.5, 1)])))
    for partial, kept in zip(partials, before, strict=True):
        assert torch.equal(partial.total["w"], kept)
    totals = [p.total["w"] for p in partials]
    last = torch.tensor([0.5, 1.0], dtype=torch.float64)
    expected = ((totals[0] + totals[1] + totals[2] + last) / 12).float()
    assert torch.equal(out["w"], expected)  # bit for bit: float64 sums in worker order, one rounding


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_partials_on_a_gpu_merge_and_divide_there_to_the_cpu_s_bits():
    agg = WeightedMean()
    results = [result(1.0 / (i + 3), i + 1) for i in range(4)]
    on_card = [ClientResult({k: t.cuda() for k, t in r.update["nested"].items()}, r.weight) for r in results]
    on_host = [ClientResult(r.update["nested"], r.weight) for r in results]
    card = [fold(agg, on_card[:2]), pickle.loads(pickle.dumps(fold(agg, on_card[2:], start=2)))]
    host = [fold(agg, on_host[:2]), fold(agg, on_host[2:], start=2)]
    assert card[1].total["b"].is_cuda  # a GPU partial travels as torch ships it, not as an array
    mean_card = agg.result(agg.merge(agg.merge(agg.zero(), card[0]), card[1]))["b"]
    mean_host = agg.result(agg.merge(agg.merge(agg.zero(), host[0]), host[1]))["b"]
    assert mean_card.is_cuda and torch.equal(mean_card.cpu(), mean_host)


@pytest.mark.parametrize("num_partials", [1, 2, 3])
def test_the_one_pass_mean_of_partials_has_the_bits_of_merging_them(num_partials):
    """``merged_result``: slices summed in worker order and divided, never the merged sums; the
    same bits as ``merge`` then ``result``, for tensors longer than a slice and not a multiple of
    it, a partial with no sums (its clients' weight still counts) and read-only arrivals."""
    agg = WeightedMean()
    gen = torch.Generator().manual_seed(num_partials)
    size = 3 * 2**17 + 77

    def client(i):
        w = torch.randn(size, generator=gen) * 10 ** (i % 5 - 2)
        return ClientResult({"w": w, "b": {"x": torch.randn(5, generator=gen)}}, weight=1.0 + i / 3)

    partials = [
        _read_only_copy(fold(agg, [client(3 * p + i) for i in range(3)]))[0] for p in range(num_partials)
    ]
    partials.insert(1, fold(agg, [ClientResult(None, weight=2.5)]))  # weight, no sums
    expected_merged = agg.zero()
    for partial in partials:
        expected_merged = agg.merge(expected_merged, partial)
    expected = agg.result(expected_merged)
    out = merged_result(agg, partials)
    assert out["w"].dtype == torch.float32
    assert torch.equal(out["w"], expected["w"]) and torch.equal(out["b"]["x"], expected["b"]["x"])
    assert not torch.equal(out["w"], agg.result(partials[0])["w"]) or num_partials == 1  # all partials count


def test_the_one_pass_mean_keeps_other_aggregators_and_empty_rounds_as_they_were():
    assert merged_result(WeightedMean(), [WeightedMean().zero()]) is None
    summed = merged_result(Sum(), [fold(Sum(), [result(1.0, 2)]), fold(Sum(), [result(3.0, 1)])])
    assert torch.equal(summed["w"], torch.tensor([4.0, 8.0]))
    zero_weight = fold(WeightedMean(), [result(1.0, 0)])
    assert merged_result(WeightedMean(), [zero_weight]) is None


def test_the_one_pass_mean_sums_partials_in_worker_order():
    """(1e20 + -1e20) + 3 = 3, where any other order loses the 3: the order is the merge's."""
    agg = WeightedMean()
    values = [1e20, -1e20, 3.0]
    partials = [
        _read_only_copy(fold(agg, [ClientResult({"w": torch.full((2**18 + 5,), v)}, 1.0)]))[0] for v in values
    ]
    out = merged_result(agg, partials)["w"]
    assert torch.equal(out, torch.full((2**18 + 5,), 1.0))  # 3 / 3 clients, by hand


def test_a_placed_partial_folds_into_the_memory_it_was_given_to_the_hand_computed_sums():
    """``placed``: the first fold writes ``weight * update`` in float64 into the tensors the memory
    hands out, and later folds add there; where the memory has no room (None), the sums are the
    process's own. Sums: 2 * [1, 2] + 3 * [3, 6] = [11, 22]; 2 * 1 + 3 * 3 = 11."""
    given: list[torch.Tensor] = []

    def memory(shape, dtype):
        if len(shape) == 0:
            return None  # no room for the scalar
        given.append(torch.full(shape, 99.0, dtype=dtype))  # not zeroed: the first fold overwrites
        return given[-1]

    for agg, expected in ((WeightedMean(), 11.0), (Sum(), 4.0)):  # Sum: 1 * [1, 2] + 1 * [3, 6]
        given.clear()
        acc = agg.add(placed(agg.zero(), memory), 0, result(1.0, 2.0))
        acc = agg.add(acc, 1, result(3.0, 3.0))
        assert acc.total["w"] is given[0] and acc.total["w"].dtype == torch.float64
        assert acc.total["w"].tolist() == [expected, 2 * expected]
        assert acc.total["nested"]["b"].item() == expected  # the scalar in the process's own memory
        assert len(given) == 1


def test_placing_leaves_other_aggregators_and_started_partials_as_they_are():
    def memory(shape, dtype):
        raise AssertionError("never asked")

    assert placed(Gather().zero(), memory) == []
    started = WeightedMean().add(WeightedMean().zero(), 0, result(1.0, 1.0))
    assert placed(started, memory) is started
