"""The simulated clock: each round's drawn clients, who reports in time, and when the round ends."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from raysim.config.system import SystemConfig
from raysim.errors import ConfigError
from raysim.sampling import sample_cohort
from raysim.selection.selector import Selector, choose
from raysim.systems.devices import Fleet
from raysim.systems.work import LocalWork
from raysim.train.local import LocalTrainConfig
from raysim.types import Metrics

_DROPOUT, _STRAGGLERS, _STRAGGLER_EPOCHS = 14, 15, 16  # purpose tags (11-13: availability, devices)

REPORTED, DROPPED_OUT, OFFLINE, STRAGGLER = "reported", "dropped_out", "offline", "straggler"


@dataclass(frozen=True)
class Outcome:
    """One drawn client's round: its status, when it reported or was noticed failing (seconds from
    the round's start), and the local steps it trains (0 unless it reported)."""

    status: str
    seconds: float
    steps: int


def client_outcome(
    num_examples: int,
    steps: int,
    work: LocalWork,
    examples_per_s: float,
    comm_s: float,
    limit_s: float,
    partial_work: bool,
) -> Outcome:
    """A client that should do ``steps`` local steps and must report by ``limit_s``.

    It reports after ``comm_s + examples / examples_per_s``; or, when that is too late, with
    ``partial_work`` after the most steps that fit (at least one); else it fails at ``limit_s``.
    """
    done_s = comm_s + work.examples(num_examples, steps) / examples_per_s
    if done_s <= limit_s:
        return Outcome(REPORTED, done_s, steps)
    if partial_work:
        fit = min(work.steps_within(num_examples, (limit_s - comm_s) * examples_per_s), steps)
        if fit >= 1:
            return Outcome(REPORTED, comm_s + work.examples(num_examples, fit) / examples_per_s, fit)
    return Outcome(STRAGGLER, limit_s, 0)


@dataclass(frozen=True)
class RoundPlan:
    """A round on the simulated clock, decided before any client trains.

    Attributes:
        cohort: the clients that train and are aggregated, in draw order.
        step_budgets: the clients of ``cohort`` doing less than their full local work, and the
            local steps (batches) each does.
        selected: the clients drawn (``ceil(over_commit * cohort_size)`` of the available ones).
        outcomes: what became of each of ``selected``.
        start_s, end_s: when the round started and aggregated; ``idle_s`` the wait, before
            ``start_s``, for a client to come online.
    """

    round_num: int
    start_s: float
    end_s: float
    idle_s: float
    available: int
    selected: np.ndarray
    outcomes: list[Outcome]
    cohort: np.ndarray
    step_budgets: dict[int, int]

    def durations(self) -> dict[int, float]:
        """Each client that reported: its seconds from the round's start."""
        reported = zip(self.selected, self.outcomes, strict=True)
        return {int(client): o.seconds for client, o in reported if o.status == REPORTED}

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def metrics(self) -> Metrics:
        reported = self.count(REPORTED)
        return {
            "sys/sim_clock_s": self.end_s,
            "sys/sim_round_s": self.end_s - self.start_s + self.idle_s,
            "sys/sim_idle_s": self.idle_s,
            "sys/available_clients": float(self.available),
            "sys/selected_clients": float(len(self.selected)),
            "sys/aggregated_clients": float(len(self.cohort)),
            "sys/dropped_out": float(self.count(DROPPED_OUT)),
            "sys/dropped_offline": float(self.count(OFFLINE)),
            # late, FedProx stragglers without partial work, and reports over the cohort size
            "sys/dropped_stragglers": float(self.count(STRAGGLER) + reported - len(self.cohort)),
            "sys/partial_clients": float(len(self.step_budgets)),
        }


class SimulatedSystem:
    """The simulated clock over a fleet: ``round(r)`` plans round r, replaying earlier rounds first
    when it has not seen them (a resumed run), which needs no training; with a learning
    ``selector`` a resumed run ``resume``s from the saved round ends instead."""

    def __init__(
        self,
        config: SystemConfig,
        fleet: Fleet,
        local: LocalTrainConfig,
        pool: np.ndarray,
        *,
        cohort_size: int,
        model_bytes: float,
        seed: int,
    ) -> None:
        self.config, self.fleet, self.local, self.pool = config, fleet, local, pool
        self.cohort_size, self.model_bytes, self.seed = cohort_size, model_bytes, seed
        self._ends: list[float] = []  # the clock after each round planned so far
        self._last: RoundPlan | None = None
        self.selector: Selector | None = None  # engine.selection; None: uniform

    @property
    def ends(self) -> list[float]:
        """The clock after each round planned so far."""
        return list(self._ends)

    def resume(self, ends: list[float]) -> None:
        """Goes on after the rounds that ended at ``ends`` without replaying them: a learning
        selector's earlier picks cannot be replayed without its earlier state."""
        self._ends, self._last = [float(end) for end in ends], None

    def round(self, round_num: int) -> RoundPlan:
        if self._last is not None and self._last.round_num == round_num:
            return self._last
        if round_num < len(self._ends):  # a round planned before: plan it again from its start
            self._ends = self._ends[:round_num]
        while len(self._ends) <= round_num:
            clock = self._ends[-1] if self._ends else 0.0
            self._last = self.plan(len(self._ends), clock)
            self._ends.append(self._last.end_s)
        assert self._last is not None
        return self._last

    def plan(self, round_num: int, clock: float) -> RoundPlan:
        """Round ``round_num`` starting at ``clock``: who is drawn, who reports, when it ends."""
        availability, config = self.fleet.availability, self.config
        start = availability.next_online(self.pool, clock)
        if start is None:
            raise ConfigError(
                [
                    f"system.availability: no training client is online at or after "
                    f"{clock:.0f} s (round {round_num}): the trace ends there; give it "
                    f"a period_s to repeat it, or run fewer rounds"
                ]
            )
        online = self.pool[availability.online(self.pool, start)]
        wanted = min(math.ceil(round(config.over_commit * self.cohort_size, 9)), len(online))
        if self.selector is None:
            selected = online[sample_cohort(len(online), wanted, self.seed, round_num)]
        else:
            selected = choose(self.selector, online, wanted, self.seed, round_num)
        work = LocalWork.of(self.local, round_num)
        stragglers = straggler_positions(len(selected), config.straggler_fraction, self.seed, round_num)
        outcomes = [
            self.outcome(int(client), position in stragglers, work, round_num, start)
            for position, client in enumerate(selected)
        ]
        reports = sorted((o.seconds, i) for i, o in enumerate(outcomes) if o.status == REPORTED)
        kept = sorted(i for _, i in reports[: self.cohort_size])
        if len(reports) >= self.cohort_size:
            duration = reports[self.cohort_size - 1][0]
        else:  # wait for every drawn client's report, or for its failure to show
            duration = max((o.seconds for o in outcomes), default=0.0)
        budgets = {
            int(selected[i]): outcomes[i].steps
            for i in kept
            if outcomes[i].steps < work.steps(int(self.fleet.num_examples[selected[i]]))
        }
        return RoundPlan(
            round_num,
            start,
            start + duration,
            start - clock,
            len(online),
            selected,
            outcomes,
            selected[kept],
            budgets,
        )

    def outcome(self, client: int, straggler: bool, work: LocalWork, round_num: int, start: float) -> Outcome:
        """What becomes of ``client`` starting ``work`` at ``start`` (its draws keyed by ``round_num``):
        it reports, or fails (offline, late, dropped out) when that shows; seconds from ``start``."""
        config, fleet = self.config, self.fleet
        n, speed = int(fleet.num_examples[client]), float(fleet.examples_per_s[client])
        comm_s = 2 * self.model_bytes / float(fleet.bytes_per_s[client])  # the model down, its update up
        deadline = config.deadline_s if config.deadline_s is not None else math.inf
        offline = fleet.availability.online_until(client, start) - start
        steps, limit = work.steps(n), min(deadline, offline)
        late = OFFLINE if offline < deadline else STRAGGLER
        if straggler:
            can = work.steps(n, straggler_epochs(work.epochs, self.seed, round_num, client))
            if can < steps and config.partial_work:
                steps = can  # FedProx: the straggler's inexact solution counts
            elif can < steps and (done := comm_s + work.examples(n, can) / speed) < limit:
                limit, late = done, STRAGGLER  # FedAvg drops it when its time is up
        outcome = client_outcome(n, steps, work, speed, comm_s, limit, config.partial_work)
        if outcome.status != REPORTED:
            outcome = Outcome(late, outcome.seconds, 0)
        if drops_out(config.dropout, self.seed, round_num, client):
            outcome = Outcome(DROPPED_OUT, outcome.seconds, 0)  # noticed when its report was due
        return outcome


def drops_out(probability: float, seed: int, round_num: int, client: int) -> bool:
    """Whether ``client`` drops out of ``round_num``: a pure function of (seed, round, client)."""
    draw = np.random.default_rng([seed, round_num, client, _DROPOUT]).random()
    return probability > 0 and bool(draw < probability)


def straggler_positions(num_selected: int, fraction: float, seed: int, round_num: int) -> frozenset[int]:
    """Which of the drawn clients (by draw position) are FedProx stragglers this round:
    ``round(fraction * num_selected)`` of them, drawn from (seed, round)."""
    count = int(round(fraction * num_selected))
    order = np.random.default_rng([seed, round_num, _STRAGGLERS]).permutation(num_selected)
    return frozenset(int(i) for i in order[:count])


def straggler_epochs(epochs: int, seed: int, round_num: int, client: int) -> int:
    """The epochs a straggler can do this round: uniform in ``[1, epochs]`` as the FedProx paper
    says (sec. 5); its authors' code draws from ``[1, epochs - 1]``."""
    return int(np.random.default_rng([seed, round_num, client, _STRAGGLER_EPOCHS]).integers(1, epochs + 1))
