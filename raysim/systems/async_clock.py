"""Asynchronous FL's clients on the simulated clock: who is in flight, from which model version,
and in what order they arrive; and the staleness laws that weigh their updates.

``concurrency`` clients are in flight at once. A free slot launches a client drawn uniformly from
the idle training clients online at that moment (waiting for the first to come online), which
trains the model version current then; it reports after its transfers and local work, or fails
when it goes offline, passes the deadline, straggles or drops out, as in a synchronous round
(``SimulatedSystem.outcome``). Arrivals come in the order (time, client id); every draw is a pure
function of (seed, launch index, purpose tag), so one seed gives one order of arrivals.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from raysim.config.asynchrony import StalenessConfig
from raysim.errors import ConfigError
from raysim.systems.rounds import REPORTED, Outcome, SimulatedSystem
from raysim.systems.work import LocalWork

_LAUNCH, _STRAGGLER = 17, 18  # purpose tags (raysim.sampling's list; 11-16: the rest of systems)


@dataclass(frozen=True)
class Flight:
    """One launch: ``client`` trains model ``version`` from ``start_s``; at ``end_s`` it reports (or
    its failure shows). ``budget``: the local steps of a client doing only part of its work."""

    launch: int
    client: int
    version: int
    start_s: float
    end_s: float
    outcome: Outcome
    budget: int | None = None

    @property
    def reported(self) -> bool:
        return self.outcome.status == REPORTED


class AsyncClock:
    """The clients in flight over a fleet, as an event queue ordered by (finish time, client id)."""

    def __init__(self, system: SimulatedSystem, concurrency: int) -> None:
        self.system, self.concurrency = system, concurrency
        self.launches = 0
        self._queue: list[tuple[float, int, Flight]] = []

    @property
    def in_flight(self) -> list[Flight]:
        return [flight for _, _, flight in sorted(self._queue)]

    def fill(self, version: int, now: float) -> None:
        """Launches clients on ``version`` from ``now`` until ``concurrency`` are in flight."""
        while len(self._queue) < self.concurrency:
            flight = self.launch(version, now)
            heapq.heappush(self._queue, (flight.end_s, flight.client, flight))

    def resume(self, launches: int, in_flight: list[Flight]) -> None:
        """The clock as a checkpoint left it: ``launches`` made, ``in_flight`` not yet arrived."""
        self.launches = launches
        self._queue = [(flight.end_s, flight.client, flight) for flight in in_flight]
        heapq.heapify(self._queue)

    def pop(self) -> Flight:
        """The next arrival (a report or a failure): the earliest finish, ties by client id."""
        return heapq.heappop(self._queue)[2]

    def launch(self, version: int, now: float) -> Flight:
        system, launch = self.system, self.launches
        busy = {flight.client for _, _, flight in self._queue}
        idle = np.array([c for c in system.pool if int(c) not in busy], dtype=np.int64)
        availability = system.fleet.availability
        start = availability.next_online(idle, now)
        if start is None:
            raise ConfigError(
                [
                    f"system.availability: no idle training client is online at or after {now:.0f} s "
                    f"(launch {launch}): the trace ends there; give it a period_s to repeat it, or run "
                    f"fewer server steps"
                ]
            )
        online = idle[availability.online(idle, start)]
        client = int(online[np.random.default_rng([system.seed, launch, _LAUNCH]).integers(len(online))])
        straggler = bool(
            np.random.default_rng([system.seed, launch, _STRAGGLER]).random()
            < system.config.straggler_fraction
        )
        work = LocalWork.of(system.local, version)
        outcome = system.outcome(client, straggler, work, launch, start)
        full = work.steps(int(system.fleet.num_examples[client]))
        budget = outcome.steps if outcome.status == REPORTED and outcome.steps < full else None
        self.launches += 1
        return Flight(launch, client, version, start, start + outcome.seconds, outcome, budget)


def staleness_weight(config: StalenessConfig, tau: int) -> float:
    """s(tau): how much an update ``tau`` server steps stale counts (``StalenessConfig``)."""
    if config.kind == "polynomial":
        return float((1 + tau) ** -config.a)
    if config.kind == "hinge" and tau > config.b:
        return 1.0 / (config.a * (tau - config.b) + 1.0)
    return 1.0
