"""When clients are online: traces, periodic traces, missing clients, bad traces, diurnal windows
(raysim.systems.availability)."""

import math

import numpy as np
import pytest
from fleets import write

from raysim.config.system import (
    DiurnalAvailability,
    TraceAvailability,
)
from raysim.errors import ConfigError
from raysim.systems.availability import Diurnal, open_availability


def test_availability_from_a_small_trace(tmp_path):
    path = write(tmp_path, {"clients": {"0": [[0, 10], [20, 30]], "1": [[5, 25]], "2": [[40, 50]]}})
    trace = open_availability(TraceAvailability(path=path), 3, seed=0)
    clients = np.arange(3)
    assert trace.online(clients, 0).tolist() == [True, False, False]
    assert trace.online(clients, 7).tolist() == [True, True, False]
    assert trace.online(clients, 10).tolist() == [False, True, False]  # intervals end open
    assert trace.online_until(0, 22) == 30 and trace.online_until(1, 5) == 25
    assert trace.next_online(clients, 31) == 40 and trace.next_online(np.array([0, 1]), 31) is None


def test_a_periodic_trace_repeats_and_joins_across_the_turn(tmp_path):
    path = write(tmp_path, {"period_s": 100, "clients": {"0": [[0, 10], [90, 100]], "1": [[50, 60]]}})
    trace = open_availability(TraceAvailability(path=path), 2, seed=0)
    assert trace.online(np.arange(2), 255).tolist() == [False, True]
    assert trace.online_until(0, 195) == 210  # online from 190 through the turn to 210
    assert trace.next_online(np.array([0]), 215) == 290
    always = write(tmp_path, {"period_s": 100, "clients": {"0": [[0, 100]]}}, "always.json")
    assert open_availability(TraceAvailability(path=always), 1, seed=0).online_until(0, 250) == math.inf


def test_clients_missing_from_a_trace(tmp_path):
    path = write(tmp_path, {"clients": {"0": [[0, 10]], "1": [[20, 30]]}})
    with pytest.raises(ConfigError, match="no entry for 2 of the 4 clients.*missing: cycle or always"):
        open_availability(TraceAvailability(path=path), 4, seed=0)
    always = open_availability(TraceAvailability(path=path, missing="always"), 4, seed=0)
    assert always.online(np.arange(4), 15).tolist() == [False, False, True, True]
    cycled = open_availability(TraceAvailability(path=path, missing="cycle"), 4, seed=0)
    assert cycled.online(np.arange(4), 25).tolist() == [False, True, False, True]  # 3 -> 1


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"clients": {"0": [[10, 5]]}}, "0 <= start < end"),
        ({"clients": {"0": [[0, 10], [5, 20]]}}, "sorted and disjoint"),
        ({"period_s": 50, "clients": {"0": [[0, 60]]}}, "ends after period_s"),
        ({"clients": {"a": [[0, 1]]}}, "client keys must be client ids"),
        ({"clients": {"0": "always"}}, "list of \\[start_s, end_s\\] pairs"),
        ([1, 2], 'a "clients" object'),
    ],
)
def test_bad_traces_are_refused_with_the_key_and_the_fix(tmp_path, raw, message):
    with pytest.raises(ConfigError, match=f"system.availability.path: .*{message}"):
        open_availability(TraceAvailability(path=write(tmp_path, raw)), 1, seed=0)


def test_diurnal_availability_follows_each_clients_phase():
    diurnal = Diurnal(DiurnalAvailability(period_s=100, online_fraction=0.25), 50, seed=3)
    phase = diurnal.phase
    clients = np.arange(50)
    for t in [0.0, 37.0, 120.5]:
        expected = ((t - phase) % 100) < 25
        assert diurnal.online(clients, t).tolist() == expected.tolist()
    c = int(np.flatnonzero(diurnal.online(clients, 10.0))[0])
    assert diurnal.online_until(c, 10.0) == pytest.approx(10.0 + 25 - (10.0 - phase[c]) % 100)
    off = int(np.flatnonzero(~diurnal.online(clients, 10.0))[0])
    assert diurnal.next_online(np.array([off]), 10.0) == pytest.approx(10.0 + 100 - (10.0 - phase[off]) % 100)


def test_the_moment_a_client_comes_online_it_is_online():
    """``next_online`` computes a window's start as t + (period - into); rounding may put it just
    before the window (one period away), and a round starting then would find nobody online."""
    rng = np.random.default_rng(0)
    misses = 0
    for trial in range(2000):
        config = DiurnalAvailability(period_s=float(rng.uniform(1, 1e5)), online_fraction=0.05)
        diurnal = Diurnal(config, 20, seed=trial)
        clients = np.arange(20)
        t = float(rng.uniform(0, 1e7))
        start = diurnal.next_online(clients, t)
        misses += not diurnal.online(clients, start).any()
    assert misses == 0
