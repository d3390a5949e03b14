"""ASHA on hand-built reports: rungs at grace * factor**k rounds, each decision against the
quantile of the values recorded at the rung so far, worked out by hand."""

from raysim.config.sweep import StoppingConfig
from raysim.sweep.asha_stopping import AshaRule
from raysim.sweep.median_stopping import MedianStoppingRule
from raysim.sweep.ray_cells import stopping_rule


def test_a_cell_below_the_rungs_cut_stops_and_a_rungs_first_cell_goes_on():
    """Factor 2: the cut is the median of the values recorded at the rung (linear interpolation)."""
    rule = AshaRule("max", grace_rounds=2, reduction_factor=2)
    assert rule.report("a", 0, 0.9) is False  # 1 round trained: below the first rung (2)
    assert rule.report("a", 1, 0.5) is False  # rung 2: [0.5], cut 0.5, 0.5 is not below it
    assert rule.report("b", 1, 0.3) is True  # rung 2: [0.5, 0.3], cut 0.4 > 0.3
    assert rule.report("c", 1, 0.6) is False  # [0.5, 0.3, 0.6], cut 0.5
    assert rule.report("d", 1, 0.45) is True  # [0.5, 0.3, 0.6, 0.45], cut (0.45 + 0.5) / 2 = 0.475
    assert rule.report("a", 2, 0.1) is False  # 3 rounds: no new rung, no decision
    assert rule.report("a", 3, 0.7) is False  # rung 4: a is its first cell


def test_a_report_that_crosses_several_rungs_is_judged_at_each():
    """Grace 1, factor 3: rungs 1, 3, 9. c first reports after 3 rounds, so it enters rungs 1 and
    3 at once; at rung 3 alone ([0.8, 0.2]) its 0.2 is below the cut 0.8 - (0.6 * 1/3) = 0.6."""
    rule = AshaRule("max", grace_rounds=1, reduction_factor=3)
    for round_num, value in enumerate([0.5, 0.7, 0.8]):
        assert rule.report("a", round_num, value) is False
    assert rule.report("c", 2, 0.2) is True
    assert rule.rungs == {1: {"a": 0.5, "c": 0.2}, 3: {"a": 0.8, "c": 0.2}}


def test_min_mode_keeps_the_lowest():
    """Factor 3, mode min: the cut is the 1/3 quantile; [1.0, 2.0] -> 1.0 + (1/3) * 1.0 = 1.3333."""
    rule = AshaRule("min", grace_rounds=1, reduction_factor=3)
    assert rule.report("a", 0, 1.0) is False
    assert rule.report("b", 0, 2.0) is True  # 2.0 > 1.3333
    assert rule.report("c", 0, 0.5) is False  # sorted [0.5, 1.0, 2.0]: cut 0.5 + (2/3) * 0.5 = 0.8333


def test_the_sweep_picks_its_rule():
    median = StoppingConfig(metric="eval/central/accuracy", mode="max")
    asha = StoppingConfig(metric="eval/central/accuracy", mode="max", rule="asha", reduction_factor=4)
    assert isinstance(stopping_rule(median), MedianStoppingRule)
    chosen = stopping_rule(asha)
    assert isinstance(chosen, AshaRule) and chosen.reduction_factor == 4
