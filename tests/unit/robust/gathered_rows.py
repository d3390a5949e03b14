"""A round's gathered output built from plain rows, as the workers' ``GatheredUpdates`` would fold
them: one client a row, weight 1, cohort positions in row order."""

import numpy as np
import torch

from raysim.aggregate import WeightedMean
from raysim.gathered_updates import GatheredUpdates
from raysim.types import ClientResult, RoundOutput


def round_output(rows: np.ndarray) -> RoundOutput:
    gather = GatheredUpdates(WeightedMean())
    acc = gather.zero()
    for position, row in enumerate(rows):
        acc = gather.add(acc, position, ClientResult({"w": torch.tensor(row)}, weight=1.0))
    return RoundOutput(aggregate=gather.result(acc), clients=[], failures=[])
