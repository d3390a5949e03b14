"""When clients are online, on the simulated clock: always, diurnal windows, or a trace file."""

from __future__ import annotations

import bisect
import math
from typing import Any, Protocol

import numpy as np

from raysim.config.system import AvailabilityConfig, DiurnalAvailability, TraceAvailability
from raysim.errors import ConfigError
from raysim.systems.traces import per_client, read_json, trace_clients

_PHASE = 11  # a purpose tag: a stream independent of raysim.sampling's (1..4) and the others here


class Availability(Protocol):
    """When clients are online, on the simulated clock (seconds)."""

    def online(self, clients: np.ndarray, t: float) -> np.ndarray:
        """A mask: which of ``clients`` are online at ``t``."""
        ...

    def online_until(self, client: int, t: float) -> float:
        """When the online interval of ``client`` that holds ``t`` ends (inf: never)."""
        ...

    def next_online(self, clients: np.ndarray, t: float) -> float | None:
        """The first moment from ``t`` on that one of ``clients`` is online; None: never again."""
        ...


class Always:
    def online(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.ones(len(clients), dtype=bool)

    def online_until(self, client: int, t: float) -> float:
        return math.inf

    def next_online(self, clients: np.ndarray, t: float) -> float | None:
        return t if len(clients) else None


class Diurnal:
    """Client ``c`` is online in ``[phase_c + k P, phase_c + k P + f P)`` for every integer k."""

    def __init__(self, config: DiurnalAvailability, num_clients: int, seed: int) -> None:
        self.period, self.window = config.period_s, config.online_fraction * config.period_s
        self.phase = np.random.default_rng([seed, _PHASE]).random(num_clients) * self.period

    _SLACK = 1e-9  # relative: a round that starts when a window opens sees that client online

    def _into_period(self, clients: np.ndarray | int, t: float) -> Any:
        into = np.mod(t - self.phase[clients], self.period)
        # t computed as a window's start may land a rounding error before it, i.e. a period later
        return np.where(self.period - into <= self._SLACK * max(self.period, abs(t)), 0.0, into)

    def online(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.asarray(self._into_period(clients, t) < self.window)

    def online_until(self, client: int, t: float) -> float:
        if self.window >= self.period:
            return math.inf
        return t + self.window - float(self._into_period(client, t))

    def next_online(self, clients: np.ndarray, t: float) -> float | None:
        if not len(clients):
            return None
        into = self._into_period(clients, t)
        wait = np.where(into < self.window, 0.0, self.period - into)
        return t + float(wait.min())


class Trace:
    """Sorted, disjoint ``[start, end)`` intervals per client, repeated every ``period`` if set."""

    def __init__(self, intervals: list[list[tuple[float, float]]], period: float | None) -> None:
        self.starts = [[s for s, _ in spans] for spans in intervals]
        self.ends = [[e for _, e in spans] for spans in intervals]
        self.period = period

    def _split(self, t: float) -> tuple[float, float]:
        """(start of t's period, t's offset in it); (0, t) for a trace that does not repeat."""
        if self.period is None:
            return 0.0, t
        offset = math.fmod(t, self.period)
        return t - offset, offset

    def _interval(self, client: int, offset: float) -> int | None:
        i = bisect.bisect_right(self.starts[client], offset) - 1
        return i if i >= 0 and offset < self.ends[client][i] else None

    def online(self, clients: np.ndarray, t: float) -> np.ndarray:
        _, offset = self._split(t)
        return np.array([self._interval(int(c), offset) is not None for c in clients], dtype=bool)

    def online_until(self, client: int, t: float) -> float:
        base, offset = self._split(t)
        i = self._interval(client, offset)
        if i is None:
            return t
        end = self.ends[client][i]
        if self.period is not None and self.starts[client] == [0] and end >= self.period:
            return math.inf  # online the whole period, every period
        if self.period is not None and end >= self.period and self.starts[client][0] == 0:
            end = self.period + self.ends[client][0]  # online across the period's turn
        return base + end

    def next_online(self, clients: np.ndarray, t: float) -> float | None:
        base, offset = self._split(t)
        found = [self._next_start(int(c), base, offset) for c in clients]
        times = [f for f in found if f is not None]
        return min(times) if times else None

    def _next_start(self, client: int, base: float, offset: float) -> float | None:
        if self._interval(client, offset) is not None:
            return base + offset
        starts = self.starts[client]
        i = bisect.bisect_right(starts, offset)
        if i < len(starts):
            return base + starts[i]
        return base + self.period + starts[0] if self.period is not None and starts else None


def open_availability(config: AvailabilityConfig, num_clients: int, seed: int) -> Availability:
    """The availability model ``config`` describes, for clients ``0..num_clients-1``."""
    if isinstance(config, DiurnalAvailability):
        return Diurnal(config, num_clients, seed)
    if isinstance(config, TraceAvailability):
        return _read_availability(config, num_clients)
    return Always()


def _read_availability(config: TraceAvailability, num_clients: int) -> Trace:
    where = "system.availability.path"
    raw = read_json(config.path, where)
    period = raw.get("period_s")
    if period is not None and not (isinstance(period, int | float) and period > 0):
        raise ConfigError([f"{where}: {config.path}: period_s must be a positive number, got {period!r}"])
    listed: dict[int, list[tuple[float, float]]] = {}
    for key, spans in trace_clients(raw, config.path, where).items():
        listed[key] = _intervals(spans, period, f"{where}: {config.path}: client {key}")
    always = [(0.0, period if period is not None else math.inf)]
    intervals = per_client(listed, num_clients, config.missing, always, where, config.path)
    return Trace(intervals, None if period is None else float(period))


def _intervals(raw: Any, period: float | None, where: str) -> list[tuple[float, float]]:
    try:
        spans = [(float(start), float(end)) for start, end in raw]
    except (TypeError, ValueError):
        raise ConfigError([f"{where}: must be a list of [start_s, end_s] pairs, got {raw!r}"]) from None
    previous_end = -math.inf
    for start, end in spans:
        if not 0 <= start < end:
            raise ConfigError([f"{where}: interval [{start}, {end}] must have 0 <= start < end"])
        if start < previous_end:
            raise ConfigError([f"{where}: intervals must be sorted and disjoint; [{start}, {end}] is not"])
        if period is not None and end > period:
            raise ConfigError([f"{where}: interval [{start}, {end}] ends after period_s {period}"])
        previous_end = end
    return spans
