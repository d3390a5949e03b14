"""LPT sharding of a cohort over workers."""

import numpy as np

from raysim.runtime.backend import shard_cohort


def test_largest_first_to_least_loaded_worker():
    # sizes 10, 8, 5, 4, 3 over 2 workers: 10 -> w0; 8 -> w1; 5 -> w1 (8 < 10, now 13);
    # 4 -> w0 (10 < 13, now 14); 3 -> w1 (13 < 14)
    cohort = np.array([100, 101, 102, 103, 104])
    sizes = np.array([10, 8, 5, 4, 3])
    shards = shard_cohort(cohort, sizes, 2)
    assert shards == [[(0, 100), (3, 103)], [(1, 101), (2, 102), (4, 104)]]


def test_every_client_once_and_in_cohort_order_within_a_shard():
    cohort = np.arange(50)[::-1]
    sizes = np.random.default_rng(0).integers(1, 100, size=50)
    shards = shard_cohort(cohort, sizes, 4)
    positions = sorted(p for s in shards for p, _ in s)
    assert positions == list(range(50))
    assert all(s == sorted(s) for s in shards)
    loads = [sum(int(sizes[p]) for p, _ in s) for s in shards]
    assert max(loads) - min(loads) <= sizes.max()


def test_one_worker_gets_the_cohort_in_order():
    cohort = np.array([5, 3, 9])
    assert shard_cohort(cohort, np.array([1, 7, 2]), 1) == [[(0, 5), (1, 3), (2, 9)]]
