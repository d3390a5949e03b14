"""Power-of-choice selection (Cho, Wang and Joshi, "Client Selection in Federated Learning:
Convergence Analysis and Power-of-Choice Selection Strategies", 2020), its computation-free
variant rpow-d.

A round draws ``d`` candidates without replacement with probability proportional to their data
size (the paper's ``p_k``), then takes the ``k`` with the highest loss. The full pow-d evaluates
every candidate's loss on the current model, an extra pass over d clients a round; rpow-d, as
here, ranks them by the mean training loss each reported when it last trained, clients never
seen first (in draw order, as are ties). Where ``k`` exceeds ``d`` (a ``system:`` section's
over-commitment), ``k`` candidates are drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raysim.selection.selector import Feedback, weighted_draw


class PowerOfChoice:
    """``engine.selection: {kind: power_of_choice, d}``; ``sizes`` each client's training examples."""

    def __init__(self, d: int | None, sizes: np.ndarray) -> None:
        self.d, self.sizes = d, np.asarray(sizes, np.float64)
        self.loss: dict[int, float] = {}  # the mean training loss each reported when it last trained

    def select(self, candidates: np.ndarray, k: int, round_num: int, rng: np.random.Generator) -> np.ndarray:
        candidates = np.asarray(candidates, np.int64)
        d = min(len(candidates), max(k, self.d if self.d is not None else 2 * k))
        drawn = weighted_draw(rng, candidates, d, self.sizes[candidates])
        loss = np.array([self.loss.get(int(c), np.inf) for c in drawn])
        return drawn[np.argsort(-loss, kind="stable")[:k]]

    def observe(self, round_num: int, feedback: Sequence[Feedback]) -> None:
        self.loss |= {f.client_id: f.loss for f in feedback}

    def state(self) -> dict[str, Any]:
        clients = sorted(self.loss)
        return {"clients": clients, "loss": [self.loss[c] for c in clients]}

    def restore(self, state: dict[str, Any]) -> None:
        self.loss = {int(c): float(v) for c, v in zip(state["clients"], state["loss"], strict=True)}
