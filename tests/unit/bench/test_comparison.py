"""One headline per comparison: the ratio of the two sides' medians, with the interquartile range
of the per-round ratios and the number of rounds; the median of the ratios kept apart, named."""

import pytest

from raysim.bench.comparison import Ratio


def test_the_headline_is_the_ratio_of_the_medians_not_the_median_of_the_ratios():
    # a run whose per-round ratios straddle 1 while its medians say 1.22x, as the LM run did
    raysim, plain = [2.0, 2.1, 1.2, 2.3, 1.3], [1.7, 1.8, 1.69, 1.6, 1.68]
    ratio = Ratio.of(raysim, plain)
    assert ratio.headline == pytest.approx(2.0 / 1.69)
    per_round = sorted(r / p for r, p in zip(raysim, plain))  # 0.710, 0.774, 1.167, 1.176, 1.4375
    assert ratio.median_of_ratios == pytest.approx(per_round[2])
    assert (ratio.low, ratio.high) == pytest.approx((per_round[1], per_round[3]))  # quartiles of 5 values
    assert ratio.rounds == 5
    assert (
        ratio.text() == f"{2.0 / 1.69:.3f}x (per-round IQR {per_round[1]:.3f}-{per_round[3]:.3f}, 5 rounds)"
    )


def test_the_figures_name_the_headline_and_label_the_other_estimator():
    figures = Ratio.of([3.0, 1.0], [2.0, 2.0]).figures("vectorized_vs_plain")
    assert figures == {
        "vectorized_vs_plain": 1.0,
        "vectorized_vs_plain_iqr": [pytest.approx(0.75), pytest.approx(1.25)],
        "vectorized_vs_plain_median_of_round_ratios": 1.0,
    }


def test_sides_of_different_rounds_are_refused():
    with pytest.raises(ValueError, match="same timed rounds"):
        Ratio.of([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        Ratio.of([], [])
