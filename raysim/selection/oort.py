"""Oort's guided participant selection (Lai et al., "Oort: Efficient Federated Learning via Guided
Participant Selection", OSDI 2021, Algorithm 1).

A client's utility is its statistical utility ``U_i = |B_i| * sqrt(mean of its examples' squared
losses)`` from its last participation, plus the exploration bonus ``sqrt(0.1 log R / L_i)`` (R the
round, L_i the round it last trained), times the system penalty ``(T / t_i) ** alpha`` when it took
``t_i`` seconds, longer than the preferred round duration T. A round exploits ``(1 - eps) * k``
explored clients, drawn with probability proportional to utility among those above ``cutoff``
times the cut-off client's (the ``(1 - eps) * k``-th best), and explores ``eps * k`` unexplored
ones, faster ones (by the fleet's speed) more likely; eps decays by ``epsilon_decay`` a round to
``epsilon_min``. The pacer raises T by a step when the statistical utility summed over the last
``window`` rounds falls below that of the ``window`` before.

Departures, each stated in docs/systems.md:

- The clients report only their mean loss (``train/loss``), so ``U_i = |B_i| * mean loss``, a lower
  bound of the paper's root mean square (equal when every example's loss is the same).
- The statistical utilities are normalized before the bonus is added as the authors' code does
  (FedScale's oort ``get_norm``; else the bonus, under 1, is lost beside ``|B_i| * loss``): over
  the explored clients' utilities sorted, clipped at the one at index ``int(clip_quantile * n)``,
  then ``(min(u, clip) - 0.999 min) / max(max - 0.999 min, 1e-4)``, ``max`` the unclipped
  maximum. R and L_i count rounds from 1.
- T starts at ``round_s``, or at the 30th percentile of the first trained round's durations (the
  authors' code's ``round_threshold``), and stays there but for the pacer, which adds
  ``pacer_step_s`` seconds (or a tenth of T's start), as the paper's Algorithm 1 does; the
  authors' code instead recomputes T each round as a percentile of every duration it knows, and
  its pacer moves that percentile. The pacer looks every ``window`` rounds (the authors' code),
  not every round.
- Without a ``system:`` section there are no durations: no penalty, no pacer, and exploration is
  uniform. Clients that were drawn but did not report stay unexplored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raysim.config.selection import OortSelection
from raysim.selection.selector import Feedback, weighted_draw

T_PERCENTILE = 30.0  # T's start among the first durations (the authors' code's round_threshold)
LOW_SHARE = 0.999  # the authors' code scales from just below the least utility: none scores 0
RANGE_FLOOR = 1e-4  # ... and over a range of at least this (its ``thres``)


class Oort:
    """``engine.selection: {kind: oort}``; ``speeds`` each client's examples/s (None: no system)."""

    def __init__(self, config: OortSelection, speeds: np.ndarray | None) -> None:
        self.config, self.speeds = config, speeds
        self.utility: dict[int, float] = {}  # statistical utility at the last participation
        self.last_round: dict[int, int] = {}
        self.seconds: dict[int, float] = {}
        self.round_utility: list[float] = []  # the statistical utility each trained round summed
        self.round_s: float | None = config.round_s  # T
        self.step_s: float | None = config.pacer_step_s

    def epsilon(self, round_num: int) -> float:
        config = self.config
        return max(config.epsilon_min, config.epsilon * config.epsilon_decay**round_num)

    def select(self, candidates: np.ndarray, k: int, round_num: int, rng: np.random.Generator) -> np.ndarray:
        candidates = np.asarray(candidates, np.int64)
        seen = np.array([int(c) in self.utility for c in candidates], bool)
        explored, unexplored = candidates[seen], candidates[~seen]
        explore = min(len(unexplored), max(k - len(explored), int(round(self.epsilon(round_num) * k))))
        exploited = self.exploit(explored, k - explore, round_num, rng)
        speeds = self.speeds[unexplored] if self.speeds is not None else None
        return np.concatenate([exploited, weighted_draw(rng, unexplored, explore, speeds)])

    def exploit(self, explored: np.ndarray, k: int, round_num: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` of the explored clients: by utility, among those above the cut-off."""
        if k <= 0:
            return np.empty(0, np.int64)
        utility = np.maximum(self.utilities(explored, round_num), 1e-12)
        cut = np.sort(utility)[::-1][k - 1] * self.config.cutoff
        keep = utility >= cut
        return weighted_draw(rng, explored[keep], k, utility[keep])

    def utilities(self, clients: np.ndarray, round_num: int) -> np.ndarray:
        """Each client's utility this round (every one of ``clients`` explored)."""
        stat = self.normalized(np.array([self.utility[int(c)] for c in clients], np.float64))
        last = np.array([self.last_round[int(c)] + 1 for c in clients], np.float64)
        utility = stat + np.sqrt(0.1 * np.log(round_num + 1) / last)
        return utility * self.penalties(clients)

    def normalized(self, stat: np.ndarray) -> np.ndarray:
        """Statistical utilities clipped and scaled as the authors' code does (FedScale's oort
        ``get_norm``), over every explored client's."""
        every = np.sort(np.array(list(self.utility.values()), np.float64))
        clip = every[min(int(len(every) * self.config.clip_quantile), len(every) - 1)]
        low = LOW_SHARE * every[0]
        return (np.minimum(stat, clip) - low) / max(every[-1] - low, RANGE_FLOOR)

    def penalties(self, clients: np.ndarray) -> np.ndarray:
        """``(T / t_i) ** alpha`` for a client slower than T, else 1 (1 without durations)."""
        if self.round_s is None:
            return np.ones(len(clients))
        t = np.array([self.seconds.get(int(c), 0.0) for c in clients])
        slow = t > self.round_s
        return np.where(slow, (self.round_s / np.where(slow, t, 1.0)) ** self.config.alpha, 1.0)

    def observe(self, round_num: int, feedback: Sequence[Feedback]) -> None:
        for f in feedback:
            self.utility[f.client_id] = f.num_examples * abs(f.loss)
            self.last_round[f.client_id] = round_num
            if f.seconds is not None:
                self.seconds[f.client_id] = f.seconds
        self.round_utility.append(sum(f.num_examples * abs(f.loss) for f in feedback))
        durations = [f.seconds for f in feedback if f.seconds is not None]
        if self.round_s is None and durations:
            self.round_s = float(np.percentile(durations, T_PERCENTILE))
        if self.step_s is None and self.round_s is not None:
            self.step_s = self.round_s / 10
        self.pace()

    def pace(self) -> None:
        """Every ``window`` trained rounds: T up a step when the last window's utility fell."""
        w, history = self.config.window, self.round_utility
        due = len(history) >= 2 * w and len(history) % w == 0
        if due and self.round_s is not None and self.step_s is not None:
            if sum(history[-2 * w : -w]) > sum(history[-w:]):
                self.round_s += self.step_s

    def state(self) -> dict[str, Any]:
        clients = sorted(self.utility)
        return {
            "clients": clients,
            "utility": [self.utility[c] for c in clients],
            "last_round": [self.last_round[c] for c in clients],
            "seconds": [self.seconds.get(c) for c in clients],
            "round_utility": list(self.round_utility),
            "round_s": self.round_s,
            "step_s": self.step_s,
        }

    def restore(self, state: dict[str, Any]) -> None:
        rows = zip(state["clients"], state["utility"], state["last_round"], state["seconds"], strict=True)
        self.utility, self.last_round, self.seconds = {}, {}, {}
        for client, utility, last, seconds in rows:
            self.utility[int(client)], self.last_round[int(client)] = float(utility), int(last)
            if seconds is not None:
                self.seconds[int(client)] = float(seconds)
        self.round_utility = [float(u) for u in state["round_utility"]]
        self.round_s, self.step_s = state["round_s"], state["step_s"]
