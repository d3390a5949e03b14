"""Partitioners against hand-computed expectations (raysim/partition.py)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from raysim.data.partition import (
    DirichletPartition,
    DomainPartition,
    IidPartition,
    NaturalPartition,
    Partition,
    PartitionConfig,
    ShardsPartition,
    _fill,
    partition,
    stratified_holdout,
)
from raysim.errors import DataError


def client_rows(part: Partition) -> list[np.ndarray]:
    return [part.rows(c) for c in range(part.num_clients)]


def assert_every_row_once(part: Partition, num_rows: int) -> None:
    assert np.array_equal(np.sort(part.order), np.arange(num_rows))


def test_iid_sizes_are_as_even_as_possible():
    """10 rows over 3 clients: 10 = 4 + 3 + 3, the first client takes the spare row."""
    part = partition(IidPartition(num_clients=3), np.zeros(10, np.int64), None, seed=0)
    assert part.sizes.tolist() == [4, 3, 3]
    assert part.keys is None
    assert_every_row_once(part, 10)


def test_iid_is_seeded():
    labels = np.zeros(50, np.int64)
    first = partition(IidPartition(num_clients=5), labels, None, seed=1)
    again = partition(IidPartition(num_clients=5), labels, None, seed=1)
    other = partition(IidPartition(num_clients=5), labels, None, seed=2)
    assert np.array_equal(first.order, again.order)
    assert not np.array_equal(first.order, other.order)


def test_iid_needs_only_a_row_count():
    part = partition(IidPartition(num_clients=2), None, None, seed=0, num_rows=5)
    assert part.sizes.tolist() == [3, 2]


def test_shards_one_class_per_client():
    """16 rows, 4 labels x 4 rows, 4 clients x 1 shard: shards are 4 rows = exactly one label."""
    labels = np.repeat([2, 0, 3, 1], 4)
    part = partition(ShardsPartition(num_clients=4, classes_per_client=1), labels, None, seed=0)
    assert part.sizes.tolist() == [4, 4, 4, 4]
    label_sets = sorted(tuple(sorted(set(labels[rows]))) for rows in client_rows(part))
    assert label_sets == [(0,), (1,), (2,), (3,)]
    assert_every_row_once(part, 16)


def test_shards_give_k_whole_shards_per_client():
    """8 rows, labels 0..3 twice, 2 clients x 2 shards: 4 shards of 2 rows, one label each.

    So every client holds 4 rows made of 2 same-label pairs, and the two clients together hold
    every label once per pair.
    """
    labels = np.array([3, 1, 0, 2, 1, 3, 2, 0])
    part = partition(ShardsPartition(num_clients=2, classes_per_client=2), labels, None, seed=3)
    assert part.sizes.tolist() == [4, 4]
    pairs = []
    for rows in client_rows(part):
        values, counts = np.unique(labels[rows], return_counts=True)
        assert counts.tolist() in ([2, 2], [4])  # McMahan: the same class twice is allowed
        pairs += [v for v, c in zip(values, counts, strict=True) for _ in range(c // 2)]
    assert sorted(pairs) == [0, 1, 2, 3]


def test_shards_uneven_rows_use_every_row():
    """10 rows in 3 shards of 4, 3, 3 rows (sorted by label)."""
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    part = partition(ShardsPartition(num_clients=3, classes_per_client=1), labels, None, seed=0)
    assert sorted(part.sizes.tolist()) == [3, 3, 4]
    assert sorted(tuple(np.unique(labels[rows])) for rows in client_rows(part)) == [
        (0,),
        (1,),
        (2,),
    ]
    assert_every_row_once(part, 10)


def test_natural_groups_match_a_hand_grouping():
    keys = np.array(["b", "a", "b", "c", "a", "b"], dtype=object)
    part = partition(NaturalPartition(column="speaker"), None, keys, seed=0)
    assert part.keys == ["a", "b", "c"]
    assert part.sizes.tolist() == [2, 3, 1]
    assert [rows.tolist() for rows in client_rows(part)] == [[1, 4], [0, 2, 5], [3]]


def test_domain_clients_hold_one_domain_each():
    """Domain x has rows {0,2,3,5}, y has {1,4}; 2 clients per domain: 2+2 and 1+1 rows."""
    keys = np.array(["x", "y", "x", "x", "y", "x"])
    part = partition(DomainPartition(column="domain", clients_per_domain=2), None, keys, seed=0)
    assert part.keys == ["x", "x", "y", "y"]
    assert part.sizes.tolist() == [2, 2, 1, 1]
    rows = client_rows(part)
    for key, client in zip(part.keys, rows, strict=True):
        assert set(keys[client]) == {key}
    assert set(np.concatenate(rows[:2]).tolist()) == {0, 2, 3, 5}
    assert set(np.concatenate(rows[2:]).tolist()) == {1, 4}


def test_domain_with_too_few_rows_is_an_error():
    with pytest.raises(DataError, match="clients_per_domain"):
        partition(DomainPartition(column="d", clients_per_domain=3), None, np.array([0, 0, 1]), 0)


def label_entropy(part: Partition, labels: np.ndarray) -> float:
    """Mean over clients of the entropy (nats) of the client's label distribution."""
    entropies = []
    for rows in client_rows(part):
        p = np.bincount(labels[rows], minlength=10) / len(rows)
        entropies.append(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(np.mean(entropies))


LABELS = np.repeat(np.arange(10), 100)  # 1,000 rows, 10 balanced classes


def test_dirichlet_uses_every_row_once_and_respects_min_size():
    config = DirichletPartition(num_clients=10, alpha=0.3, min_size=20)
    part = partition(config, LABELS, None, seed=0)
    assert_every_row_once(part, len(LABELS))
    assert part.sizes.min() >= 20
    assert part.sizes.sum() == 1000


def test_dirichlet_is_seeded():
    config = DirichletPartition(num_clients=10, alpha=0.5)
    first, again = (partition(config, LABELS, None, seed=7) for _ in range(2))
    other = partition(config, LABELS, None, seed=8)
    assert np.array_equal(first.order, again.order)
    assert np.array_equal(first.sizes, again.sizes)
    assert not np.array_equal(first.sizes, other.sizes)


def test_dirichlet_smaller_alpha_means_more_skew():
    """Uniform labels have entropy log(10) = 2.30; Dir(0.05) clients hold few classes each."""
    skewed = partition(DirichletPartition(num_clients=10, alpha=0.05, min_size=1), LABELS, None, 0)
    mild = partition(DirichletPartition(num_clients=10, alpha=100.0), LABELS, None, 0)
    assert label_entropy(skewed, LABELS) < 1.2 < 2.2 < label_entropy(mild, LABELS)


def test_dirichlet_impossible_min_size_is_a_clear_error():
    config = DirichletPartition(num_clients=10, alpha=0.5, min_size=101)  # needs 1,010 rows
    with pytest.raises(DataError, match="min_size"):
        partition(config, LABELS, None, seed=0)


def test_dirichlet_gives_up_after_many_draws():
    """Near-degenerate Dir(0.001) almost never gives every client 90 of its ~100 rows."""
    config = DirichletPartition(num_clients=10, alpha=0.001, min_size=90)
    with pytest.raises(DataError, match="partition.alpha"):
        partition(config, LABELS, None, seed=0)


def test_dirichlet_max_size_caps_every_client():
    """Dir(0.1) over 10 clients gives some client far more than 120 of the 1,000 rows uncapped;
    with max_size 120 every client holds 20..120 rows, the cap binds, and labels stay skewed."""
    uncapped = partition(DirichletPartition(num_clients=10, alpha=0.1, min_size=20), LABELS, None, 0)
    assert uncapped.sizes.max() > 120
    config = DirichletPartition(num_clients=10, alpha=0.1, min_size=20, max_size=120)
    part, again = (partition(config, LABELS, None, seed=0) for _ in range(2))
    assert_every_row_once(part, len(LABELS))
    assert part.sizes.min() >= 20 and part.sizes.max() == 120
    assert np.array_equal(part.order, again.order)
    assert label_entropy(part, LABELS) < 1.5  # uniform labels would give log(10) = 2.30


def test_dirichlet_cap_at_the_mean_makes_equal_clients():
    """10 clients x max_size 100 = the 1,000 rows: every client must hold exactly 100."""
    config = DirichletPartition(num_clients=10, alpha=0.3, max_size=100)
    assert partition(config, LABELS, None, seed=1).sizes.tolist() == [100] * 10


def test_dirichlet_cap_that_no_client_reaches_changes_nothing():
    """The capped path draws the same proportions and cuts them the same way."""
    plain = partition(DirichletPartition(num_clients=10, alpha=0.5), LABELS, None, seed=3)
    capped = partition(DirichletPartition(num_clients=10, alpha=0.5, max_size=1000), LABELS, None, seed=3)
    assert np.array_equal(plain.order, capped.order) and np.array_equal(plain.sizes, capped.sizes)


def test_capped_fill_redistributes_by_share():
    """10 rows by shares (0.5, 0.3, 0.2): cuts at floor(10 x (0.5, 0.8)) give 5, 3, 2.

    - room (3, 10, 10): client 0 keeps 3; its 2 spare rows are split 0.6 : 0.4 over clients 1
      and 2, cut at floor(2 x 0.6) = 1: (1, 1), so (3, 4, 3).
    - room (0, 10, 10), 5 rows: client 0 is full, shares 0.6 : 0.4, cut at floor(5 x 0.6) = 3:
      (0, 3, 2).
    - shares (1, 0, 0), 6 rows, room (2, 3, 5): client 0 takes 2; the other shares are zero, so
      the 4 left go by room 3 : 5, cut at floor(4 x 3/8) = 1: (2, 1, 3).
    """
    shares = np.array([0.5, 0.3, 0.2])
    assert _fill(shares, 10, np.array([3, 10, 10])).tolist() == [3, 4, 3]
    assert _fill(shares, 5, np.array([0, 10, 10])).tolist() == [0, 3, 2]
    assert _fill(np.array([1.0, 0.0, 0.0]), 6, np.array([2, 3, 5])).tolist() == [2, 1, 3]


def test_dirichlet_max_size_too_small_for_the_data_is_a_clear_error():
    config = DirichletPartition(num_clients=10, alpha=0.5, min_size=0, max_size=99)  # 990 < 1,000
    with pytest.raises(DataError, match="max_size 99 hold at most 990 rows"):
        partition(config, LABELS, None, seed=0)


def test_dirichlet_max_size_below_min_size_is_refused():
    with pytest.raises(ValidationError, match="max_size"):
        DirichletPartition(min_size=20, max_size=10)


def test_unset_max_size_leaves_the_config_dump_as_before():
    """Store cache paths hash the dump: an unset max_size must not appear in it."""
    assert "max_size" not in DirichletPartition().model_dump_json()
    assert DirichletPartition(max_size=50).model_dump()["max_size"] == 50


@pytest.mark.parametrize(
    "config",
    [DirichletPartition(num_clients=2), ShardsPartition(num_clients=2)],
    ids=["dirichlet", "shards"],
)
def test_label_partitioners_need_labels(config):
    with pytest.raises(DataError, match="needs labels"):
        partition(config, None, np.array(["a", "b"]), seed=0)


def test_natural_needs_its_column():
    with pytest.raises(DataError, match="'speaker'"):
        partition(NaturalPartition(column="speaker"), np.zeros(3, np.int64), None, seed=0)


@pytest.mark.parametrize(
    "config",
    [IidPartition(num_clients=11), ShardsPartition(num_clients=6, classes_per_client=2)],
    ids=["iid", "shards"],
)
def test_more_clients_than_rows_is_an_error(config):
    with pytest.raises(DataError, match="num_clients"):
        partition(config, np.zeros(10, np.int64), None, seed=0)


def test_configs_parse_as_a_discriminated_union():
    adapter = TypeAdapter(PartitionConfig)
    parsed = adapter.validate_python({"kind": "dirichlet", "num_clients": 5, "alpha": 0.1})
    assert parsed == DirichletPartition(num_clients=5, alpha=0.1, min_size=10)
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "iid", "num_client": 5})  # typo: extra="forbid"
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "dirichlet", "alpha": 0})


def test_partition_rejects_sizes_that_do_not_cover_order():
    with pytest.raises(DataError, match="sum"):
        Partition(order=np.arange(5), sizes=np.array([2, 2]))


def test_stratified_holdout_keeps_class_proportions():
    """Classes of 50, 30, 20 rows, hold out 10: exactly 5, 3 and 2."""
    labels = np.repeat([0, 1, 2], [50, 30, 20])
    kept, held = stratified_holdout(labels, 10, seed=0)
    assert np.bincount(labels[held]).tolist() == [5, 3, 2]
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(100))


def test_stratified_holdout_gives_spare_rows_by_largest_remainder():
    """Classes of 5, 3, 2 rows, hold out 3: quotas 1.5, .9, .6 floor to 1, 0, 0; the 2 spare
    rows go to the largest remainders (.9, .6), so 1, 1, 1 (rounding would give 2, 1, 1)."""
    labels = np.repeat([0, 1, 2], [5, 3, 2])
    _, held = stratified_holdout(labels, 3, seed=0)
    assert np.bincount(labels[held], minlength=3).tolist() == [1, 1, 1]
