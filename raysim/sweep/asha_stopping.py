"""Asynchronous successive halving, ASHA (Li et al., "A System for Massively Parallel
Hyperparameter Tuning", MLSys 2020), as a stopping rule over a sweep's cells.

Rungs sit at ``grace_rounds * reduction_factor**k`` rounds (1, 3, 9, ... with grace 1 and factor
3). The first time a cell's report shows it has trained at least a rung's rounds, its value is
recorded at that rung, and the cell goes on only if the value is in the best
``1 / reduction_factor`` of the values recorded there so far (this one included): below the
``1 - 1 / reduction_factor`` quantile (numpy's linear interpolation) for ``mode: max``, above the
``1 / reduction_factor`` quantile for ``min``. No cell waits for another: a rung's first cells
always go on, which is what makes it asynchronous.

Usage:
    rule = AshaRule("max", grace_rounds=1, reduction_factor=3)
    rule.report("fedavg_lr0.01_seed0", round_num=2, value=0.81)   # True: stop this cell
"""

from __future__ import annotations

from typing import Literal

import numpy as np


class AshaRule:
    def __init__(self, mode: Literal["max", "min"], grace_rounds: int, reduction_factor: int) -> None:
        self.mode = mode
        self.grace_rounds = grace_rounds
        self.reduction_factor = reduction_factor
        self.rungs: dict[int, dict[str, float]] = {}  # rung (rounds) -> cell -> its value there

    def report(self, cell: str, round_num: int, value: float) -> bool:
        """Records a cell's value at a round (rounds count from 0, so ``round_num + 1`` rounds
        are trained); True when the cell should stop now."""
        stop = False
        rung = self.grace_rounds
        while rung <= round_num + 1:
            recorded = self.rungs.setdefault(rung, {})
            if cell not in recorded:
                recorded[cell] = value
                stop = stop or self.below_cut(value, list(recorded.values()))
            rung *= self.reduction_factor
        return stop

    def below_cut(self, value: float, values: list[float]) -> bool:
        """Whether ``value`` misses the best ``1 / reduction_factor`` of ``values``."""
        keep = 1 / self.reduction_factor
        if self.mode == "max":
            return value < float(np.percentile(values, 100 * (1 - keep)))
        return value > float(np.percentile(values, 100 * keep))
