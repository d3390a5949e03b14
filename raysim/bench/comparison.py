"""One headline per comparison of two sides' interleaved rounds: the ratio of their medians, with
the spread of the per-round ratios (their interquartile range) and the number of timed rounds.

The median of the per-round ratios is another estimator, and it can disagree with the medians a
table shows beside it (1.05x against 2.07 / 1.69 = 1.22x in one 8-round run): it is kept in the
figures under its own name and never printed as the headline.

Usage:
    overhead = Ratio.of(raysim_s, [p / cores for p in plain_s])
    print(f"raysim / ideal {overhead.text()}")   # 1.107x (per-round IQR 1.041-1.163, 15 rounds)
    figures |= overhead.figures("ratio_to_ideal")
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Ratio:
    """``headline``: the median of the numerator's rounds over the denominator's; ``low`` and
    ``high``: the 25th and 75th percentiles of the per-round ratios; ``rounds``: how many."""

    headline: float
    low: float
    high: float
    median_of_ratios: float
    rounds: int

    @classmethod
    def of(cls, numerator: Sequence[float], denominator: Sequence[float]) -> Ratio:
        """The ratio of two sides timed round by round (the same rounds, interleaved).

        Raises:
            ValueError: no rounds, or not one denominator round per numerator round.
        """
        if not numerator or len(numerator) != len(denominator):
            raise ValueError(
                f"a ratio needs the same timed rounds on both sides: {len(numerator)} and {len(denominator)}"
            )
        per_round = [n / d for n, d in zip(numerator, denominator, strict=True)]
        low, high = np.percentile(per_round, [25, 75])
        headline = statistics.median(numerator) / statistics.median(denominator)
        return cls(headline, float(low), float(high), statistics.median(per_round), len(per_round))

    def text(self) -> str:
        """``1.107x (per-round IQR 1.041-1.163, 15 rounds)``: the spread is the per-round ratios',
        which need not hold the ratio of the medians (a few rounds that pair a fast round of one
        side with a slow one of the other)."""
        return f"{self.headline:.3f}x (per-round IQR {self.low:.3f}-{self.high:.3f}, {self.rounds} rounds)"

    def figures(self, name: str) -> dict[str, Any]:
        """The headline under ``name``; its spread and the other estimator beside it, named so."""
        return {
            name: self.headline,
            f"{name}_iqr": [self.low, self.high],
            f"{name}_median_of_round_ratios": self.median_of_ratios,
        }
