"""The median stopping rule on hand-built metric histories, each decision worked out by hand."""

from raysim.sweep.median_stopping import MedianStoppingRule


def feed(rule, cell, values):
    """Reports ``values`` at rounds 0, 1, ...; the last decision."""
    return [rule.report(cell, round_num, value) for round_num, value in enumerate(values)][-1]


def test_a_cell_below_the_median_of_the_others_running_averages_stops():
    rule = MedianStoppingRule("max", grace_rounds=2, min_cells=3)
    feed(rule, "a", [0.5, 0.7, 0.9])  # running average to round 2: 0.7
    feed(rule, "b", [0.4, 0.6, 0.8])  # 0.6
    feed(rule, "c", [0.1, 0.2, 0.3])  # 0.2
    assert rule.report("d", 0, 0.1) is False  # within the grace rounds
    assert rule.report("d", 1, 0.2) is False
    # round 2: peers a, b, c -> median of (0.7, 0.6, 0.2) = 0.6; d's best so far 0.65 >= 0.6
    assert rule.report("d", 2, 0.65) is False
    # e at round 2: peers a, b, c, d (0.1, 0.2, 0.65 -> 0.31667): median (0.31667 + 0.6) / 2 = 0.45833
    assert feed(rule, "e", [0.1, 0.2, 0.4]) is True  # best 0.4 < 0.45833
    assert rule.report("e", 2, 0.5) is False  # best 0.5 >= 0.45833 (the report replaces round 2's)


def test_the_median_is_of_peers_that_reached_the_round_and_min_cells_counts_them():
    rule = MedianStoppingRule("max", grace_rounds=1, min_cells=3)
    feed(rule, "a", [0.8, 0.8])
    feed(rule, "short", [0.9])  # never reached round 1: not a peer at round 1
    assert rule.report("c", 0, 0.1) is False
    assert rule.report("c", 1, 0.2) is False  # only one peer (a) reached round 1: 2 cells < 3
    feed(rule, "b", [0.7, 0.7])
    # now a (0.8) and b (0.7) reached round 1: median 0.75 > c's best 0.2
    assert rule.report("c", 1, 0.2) is True


def test_min_mode_stops_a_cell_above_the_median():
    rule = MedianStoppingRule("min", grace_rounds=0, min_cells=2)
    feed(rule, "a", [1.0, 0.5])  # running average 0.75
    assert rule.report("b", 0, 2.0) is True  # a's average to round 0: 1.0 < 2.0
    assert rule.report("c", 0, 0.9) is False  # peers a (1.0) and b (2.0): median 1.5 > 0.9
    assert rule.report("b", 1, 0.6) is False  # best 0.6; peers: a (0.75) only, c never reached round 1
