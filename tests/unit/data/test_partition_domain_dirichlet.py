"""The domain-then-label partition (``domain_dirichlet``) against hand counts."""

import numpy as np
import pytest

from raysim.data.partition import DomainDirichletPartition, partition
from raysim.errors import DataError


def two_domains() -> tuple[np.ndarray, np.ndarray]:
    """Domain "b" first in the rows (the partition sorts domains): each domain holds 5 rows of
    class 0 and 5 of class 1, interleaved."""
    keys = np.array(["b"] * 10 + ["a"] * 10)
    labels = np.tile([0, 1], 10)
    return labels, keys


def test_near_even_draws_split_each_class_of_each_domain_by_hand():
    """alpha = 1e9 draws proportions 0.5 +- 1e-5 for both clients of a domain, so each class's 5
    rows are cut at floor(0.5 * 5) = 2: the domain's first client gets 2 rows of each class, its
    second 3; clients 0-1 are domain "a", 2-3 domain "b" (sorted)."""
    labels, keys = two_domains()
    config = DomainDirichletPartition(column="d", clients_per_domain=2, alpha=1e9, min_size=0)
    part = partition(config, labels, keys, seed=3)
    assert part.keys == ["a", "a", "b", "b"]
    assert part.sizes.tolist() == [4, 6, 4, 6]
    for client, domain in enumerate(part.keys):
        rows = part.rows(client)
        assert set(keys[rows]) == {domain}
        assert np.bincount(labels[rows], minlength=2).tolist() == ([2, 2] if client % 2 == 0 else [3, 3])
    assert sorted(part.order.tolist()) == list(range(20))  # every row once


def test_small_alpha_skews_labels_within_each_domain_and_never_mixes_domains():
    rng = np.random.default_rng(0)
    keys = np.repeat(["x", "y", "z"], 600)
    labels = rng.integers(0, 10, len(keys))
    config = DomainDirichletPartition(column="d", clients_per_domain=4, alpha=0.05, min_size=5)
    part = partition(config, labels, keys, seed=1)
    assert part.keys == ["x"] * 4 + ["y"] * 4 + ["z"] * 4
    top_share = []
    for client, domain in enumerate(part.keys):
        rows = part.rows(client)
        assert set(keys[rows]) == {domain} and len(rows) >= 5
        top_share.append(np.bincount(labels[rows]).max() / len(rows))
    assert np.mean(top_share) > 0.4  # iid over 10 classes would give about 0.13
    assert partition(config, labels, keys, seed=1).order.tolist() == part.order.tolist()  # seeded


def test_a_domain_too_small_for_its_clients_names_the_domain_and_the_key():
    labels, keys = two_domains()
    config = DomainDirichletPartition(column="d", clients_per_domain=3, alpha=1.0, min_size=4)
    with pytest.raises(DataError, match=r"domain 'a'.*partition.clients_per_domain"):
        partition(config, labels, keys, seed=0)


def test_the_partition_needs_both_labels_and_the_domain_column():
    labels, keys = two_domains()
    config = DomainDirichletPartition(column="d")
    with pytest.raises(DataError, match="key column 'd'"):
        partition(config, labels, None, seed=0)
    with pytest.raises(DataError, match="labels"):
        partition(config, None, keys, seed=0)
