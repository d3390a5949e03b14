"""The median stopping rule (Golovin et al., "Google Vizier", KDD 2017) over a sweep's cells.

After its grace rounds, a cell stops when its best value of the metric so far is worse than the
median of the other cells' running averages up to the same round; only cells that reached that
round count, and only once at least ``min_cells`` cells (this one included) have.

Usage:
    rule = MedianStoppingRule("max", grace_rounds=5, min_cells=3)
    rule.report("fedavg_lr0.01_seed0", round_num=7, value=0.81)   # True: stop this cell
"""

from __future__ import annotations

import statistics
from typing import Literal


class MedianStoppingRule:
    def __init__(self, mode: Literal["max", "min"], grace_rounds: int, min_cells: int) -> None:
        self.mode = mode
        self.grace_rounds = grace_rounds
        self.min_cells = min_cells
        self.histories: dict[str, dict[int, float]] = {}  # cell -> round -> value

    def report(self, cell: str, round_num: int, value: float) -> bool:
        """Records a cell's value at a round; True when the cell should stop now."""
        own = self.histories.setdefault(cell, {})
        own[round_num] = value
        if round_num < self.grace_rounds:  # every cell runs its first grace_rounds rounds
            return False
        peers = [
            statistics.fmean(v for r, v in history.items() if r <= round_num)
            for name, history in self.histories.items()
            if name != cell and max(history) >= round_num
        ]
        if len(peers) + 1 < self.min_cells:
            return False
        median = statistics.median(peers)
        so_far = [v for r, v in own.items() if r <= round_num]
        return max(so_far) < median if self.mode == "max" else min(so_far) > median
