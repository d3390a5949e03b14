"""The ``Selector`` protocol, what a round tells it (``Feedback``), and the selector a job names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from raysim.errors import ConfigError
from raysim.sampling import selection_rng
from raysim.types import TrainedClient


@dataclass(frozen=True)
class Feedback:
    """One client that trained in a round: its examples, its mean training loss (``train/loss``)
    and, on the simulated clock, the seconds it took (None without a ``system:`` section)."""

    client_id: int
    num_examples: float
    loss: float
    seconds: float | None = None


class Selector(Protocol):
    """Picks a round's cohort and learns from the clients that trained; its state is plain values
    (a checkpoint saves it)."""

    def select(self, candidates: np.ndarray, k: int, round_num: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` distinct client ids of ``candidates`` (``k <= len(candidates)``), drawing only
        from ``rng``."""
        ...

    def observe(self, round_num: int, feedback: Sequence[Feedback]) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


def choose(selector: Selector, candidates: np.ndarray, k: int, seed: int, round_num: int) -> np.ndarray:
    """The selector's cohort of round ``round_num``, its draws from (seed, round) alone."""
    return np.asarray(selector.select(candidates, k, round_num, selection_rng(seed, round_num)), np.int64)


def feedback_of(clients: Sequence[TrainedClient], seconds: Mapping[int, float] | None) -> list[Feedback]:
    """What a round's trained clients tell a selector: each one's ``train/num_examples`` (its
    weight where it reports none) and ``train/loss``, and its seconds on the clock, if any.

    Raises:
        ConfigError: a client reports no ``train/loss``, which every selection learns from.
    """
    out = []
    for client in clients:
        if "train/loss" not in client.metrics:
            raise ConfigError(
                [
                    "engine.selection: learns from each client's train/loss, which this algorithm's "
                    "clients do not report; use engine.selection: {kind: uniform}"
                ]
            )
        examples = client.metrics.get("train/num_examples", client.weight)
        duration = None if seconds is None else seconds.get(client.client_id)
        out.append(Feedback(client.client_id, float(examples), float(client.metrics["train/loss"]), duration))
    return out


def weighted_draw(
    rng: np.random.Generator, ids: np.ndarray, k: int, weights: np.ndarray | None
) -> np.ndarray:
    """``k`` of ``ids`` without replacement, each draw with probability proportional to its weight
    among those left (uniform without weights; a weight of 0 counts as a tiny one, so ``k`` are
    always found)."""
    if k <= 0:
        return np.empty(0, np.int64)
    if weights is None:
        return ids[rng.choice(len(ids), size=k, replace=False)]
    w = np.maximum(np.asarray(weights, np.float64), 1e-12)
    return ids[rng.choice(len(ids), size=k, replace=False, p=w / w.sum())]
