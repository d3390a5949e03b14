"""Asynchronous FL's clock (raysim/systems/async_clock.py): clients in flight arrive in the order a
hand computation gives, ties broken by client id; launches are pure functions of the seed; the
staleness laws match their formulas."""

import math

import numpy as np
import pytest
from fleets import fleet, system

from raysim.config.asynchrony import StalenessConfig
from raysim.config.system import SystemConfig
from raysim.systems.async_clock import AsyncClock, staleness_weight

# 50 examples, 2 epochs, comm 2 s: client c reports 2 + 100 / speed seconds after it starts
SPEEDS = [10.0, 20.0, 25.0]  # 12 s, 7 s, 6 s


def test_a_full_fleet_arrives_in_the_hand_computed_order_ties_by_client_id():
    clock = AsyncClock(system(SystemConfig(), fleet(SPEEDS)), concurrency=3)
    clock.fill(0, 0.0)
    seen = []
    for _ in range(8):
        flight = clock.pop()
        seen.append((flight.end_s, flight.client, flight.start_s))
        clock.fill(0, flight.end_s)  # the one idle client (itself) starts again
    # each client reports every 12, 7, 6 s; at 12 s clients 0 and 2 tie, client 0 first
    assert seen == [
        (6.0, 2, 0.0),
        (7.0, 1, 0.0),
        (12.0, 0, 0.0),
        (12.0, 2, 6.0),
        (14.0, 1, 7.0),
        (18.0, 2, 12.0),
        (21.0, 1, 14.0),
        (24.0, 0, 12.0),
    ]


def test_a_launch_trains_the_version_current_when_it_starts():
    clock = AsyncClock(system(SystemConfig(), fleet(SPEEDS)), concurrency=3)
    clock.fill(0, 0.0)
    first = clock.pop()
    clock.fill(5, first.end_s)
    assert sorted((f.client, f.version) for f in clock.in_flight) == [(0, 0), (1, 0), (2, 5)]


def launched(seed):
    clock = AsyncClock(system(SystemConfig(), fleet([10.0 + c for c in range(10)]), seed=seed), concurrency=3)
    clock.fill(0, 0.0)
    order = []
    for _ in range(12):
        flight = clock.pop()
        order.append((flight.client, flight.launch))
        clock.fill(0, flight.end_s)
    return order


def test_one_seed_gives_one_order_of_arrivals_and_another_seed_another():
    assert launched(0) == launched(0)
    assert launched(0) != launched(1)


def test_no_client_is_in_flight_twice():
    clock = AsyncClock(system(SystemConfig(), fleet([10.0 + c for c in range(5)])), concurrency=4)
    clock.fill(0, 0.0)
    for _ in range(20):
        clock.fill(0, clock.pop().end_s)
        clients = [f.client for f in clock.in_flight]
        assert len(set(clients)) == len(clients) == 4


def test_dropouts_arrive_as_failures():
    clock = AsyncClock(system(SystemConfig(dropout=0.5), fleet(SPEEDS * 3)), concurrency=4)
    clock.fill(0, 0.0)
    statuses = set()
    for _ in range(30):
        flight = clock.pop()
        statuses.add(flight.reported)
        clock.fill(0, flight.end_s)
    assert statuses == {True, False}


@pytest.mark.parametrize(
    ("kind", "tau", "expected"),
    [
        ("constant", 7, 1.0),
        ("polynomial", 0, 1.0),
        ("polynomial", 3, 0.5),  # FedBuff's 1 / sqrt(1 + 3)
        ("hinge", 4, 1.0),  # up to b
        ("hinge", 6, 1 / 21),  # 1 / (10 (6 - 4) + 1)
    ],
)
def test_staleness_laws(kind, tau, expected):
    config = StalenessConfig(kind=kind, a=10.0 if kind == "hinge" else 0.5, b=4)
    assert math.isclose(staleness_weight(config, tau), expected)


def test_polynomial_staleness_decays_with_its_exponent():
    weights = [staleness_weight(StalenessConfig(kind="polynomial", a=1.0), tau) for tau in range(4)]
    assert np.allclose(weights, [1, 1 / 2, 1 / 3, 1 / 4])
