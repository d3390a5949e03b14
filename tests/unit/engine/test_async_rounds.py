"""Asynchronous FL's server steps (raysim/engine/async_rounds.py): each step's arrivals and their
staleness as worked out by hand, FedBuff's staleness-weighted buffer and FedAsync's mixing against
numpy, and the arrivals grouped by start version."""

import numpy as np
import torch

from raysim.config.system import SystemConfig
from raysim.engine.async_rounds import batches, buffered_mean, mix, server_steps
from raysim.systems.async_clock import AsyncClock, Flight
from raysim.systems.devices import Fleet
from raysim.systems.rounds import REPORTED, Outcome, SimulatedSystem
from raysim.train.local import LocalTrainConfig


def three_clients() -> SimulatedSystem:
    """Clients 0, 1, 2 report every 12, 7, 6 s: 2 s of transfers (1 MB each way at 1 MB/s), then
    2 epochs of 50 examples at 10, 20, 25 examples/s."""
    devices = Fleet(np.full(3, 50), np.array([10.0, 20.0, 25.0]), np.full(3, 1e6))
    local = LocalTrainConfig(epochs=2, batch_size=16)
    return SimulatedSystem(
        SystemConfig(), devices, local, np.arange(3), cohort_size=3, model_bytes=1e6, seed=0
    )


def test_each_steps_arrivals_and_staleness_match_the_hand_computed_schedule():
    clock = AsyncClock(three_clients(), concurrency=3)
    steps = [
        [(f.end_s, f.client, step - f.version) for f in arrived]
        for step, arrived, _ in server_steps(clock, 2, 0, 4)
    ]
    # Buffer of 2, every client in flight. Step 0 folds 2 and 1 (both from version 0); 2 restarts at
    # 6 s on version 0 (the buffer still filling), 1 at 7 s on version 1. Step 1 folds 0 (version
    # 0) and 2 (version 0, at 12 s) at staleness 1; 0 restarts on version 1, 2 on version 2. Step 2
    # folds 1 (version 1, 14 s) and 2 (version 2, 18 s); 1 restarts at 14 s on version 2. Step 3
    # folds 1 (version 2, 21 s) and 0 (version 1, 24 s).
    assert steps == [
        [(6.0, 2, 0), (7.0, 1, 0)],
        [(12.0, 0, 1), (12.0, 2, 1)],
        [(14.0, 1, 1), (18.0, 2, 0)],
        [(21.0, 1, 1), (24.0, 0, 2)],
    ]


def flight(client, version):
    return Flight(0, client, version, 0.0, 1.0, Outcome(REPORTED, 1.0, 1))


def test_arrivals_train_in_groups_of_one_start_version_a_client_once_each():
    arrived = [flight(1, 0), flight(2, 1), flight(1, 0), flight(3, 0)]
    groups = [[(f.client, f.version) for f in g] for g in batches(arrived)]
    assert groups == [[(1, 0), (3, 0)], [(2, 1)], [(1, 0)]]


def test_fedbuffs_buffer_is_the_staleness_weighted_mean_of_the_groups():
    a, b = np.array([1.0, -2.0]), np.array([4.0, 0.5])
    groups = [(1.0, 3.0, {"w": torch.tensor(a)}), (0.5, 1.0, {"w": torch.tensor(b)})]
    expected = (1.0 * 3.0 * a + 0.5 * 1.0 * b) / 4.0  # sum_g s_g W_g mean_g / sum_g W_g
    assert np.allclose(buffered_mean(groups)["w"].numpy(), expected)
    assert buffered_mean([(1.0, 2.0, None)]) is None


def test_fedasync_mixes_the_clients_model_into_the_current_one():
    x, start, delta = np.array([1.0, 2.0]), np.array([0.0, 4.0]), np.array([0.5, -1.0])
    alpha = 0.6 * (1 + 2) ** -0.5  # mixing 0.6, polynomial staleness a 0.5, tau 2
    expected = (1 - alpha) * x + alpha * (start - delta)  # x_client = start - delta
    mixed = mix({"w": torch.tensor(x)}, {"w": torch.tensor(start)}, {"w": torch.tensor(delta)}, alpha)
    assert np.allclose(mixed["w"].numpy(), expected)
