"""Asynchronous FL's server steps (raysim/engine/async_rounds.py): each step's arrivals and their
staleness as worked out by hand, FedBuff's staleness-weighted buffer and FedAsync's mixing against
numpy, the arrivals grouped by start version, and ``compression.upload``'s encoding of each
arrival: its error-feedback residual read and written under its launch
(``RoundOptions.state_keys``), so a client's launches pass it on in launch order whatever order the
step's groups train in, against error-feedback top-k worked by hand, ``sys/bytes_up`` exact."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_async_setup import job

from raysim.compress.codec import ErrorFeedback
from raysim.compress.sparse import TopSparse
from raysim.compress.upload import Uplink
from raysim.config.asynchrony import AsynchronyConfig
from raysim.config.system import SystemConfig
from raysim.engine.async_rounds import batches, buffered_mean, mix, server_step, server_steps
from raysim.engine.metrics import round_metrics
from raysim.errors import ConfigError
from raysim.runtime.builders import build_algorithm
from raysim.runtime.client_state import ClientStateStore
from raysim.systems.async_clock import AsyncClock, Flight
from raysim.systems.devices import Fleet
from raysim.systems.rounds import REPORTED, Outcome, SimulatedSystem
from raysim.train.local import LocalTrainConfig
from raysim.types import ClientResult, RoundOutput, ServerState, TrainedClient


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


class EndingClock(AsyncClock):
    """``three_clients``' clock, whose availability trace ends after its sixth launch."""

    def launch(self, version, now):
        if self.launches == 6:
            raise ConfigError(["system.availability: no idle training client is online (the trace ends)"])
        return super().launch(version, now)


def test_a_finished_run_launches_no_client_it_would_not_train():
    # an outside review: the slot freed by the last step's last report was refilled after that
    # step, so a trace ending there failed a run whose every step was logged. Launches 0-2 start,
    # step 0 refills 3 (6 s); step 1 starts 4 (7 s), refills 5 (12 s), and its last slot would
    # start launch 6, the seventh: past the trace's end
    clock = EndingClock(three_clients(), concurrency=3)
    assert [step for step, _, _ in server_steps(clock, 2, 0, 2)] == [0, 1]
    assert clock.launches == 6 and len(clock.in_flight) == 2  # the slot stays free for a resume
    with pytest.raises(ConfigError, match="the trace ends"):  # a run that goes on needs it
        list(server_steps(clock, 2, 2, 3, now=12.0))


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


UPLOADS = {0: [4.0, -1.0, 0.5, 2.0], 3: [1.0, 3.0, -0.5, 0.25], 4: [0.5, 0.5, 2.5, -3.0]}  # by launch


class WorkerLike(SimpleNamespace):
    """Trains a cohort as a worker does under ``compression.upload``: each update encoded by the
    uplink, the client's state kept under the key ``state_keys`` gives (top-k 1 of 4, error feedback)."""

    def train_cohort(self, payload, cohort, version, options):
        total, clients, sent = torch.zeros(4), [], 0
        for client in (int(c) for c in cohort):
            key = options.state_keys[client]
            result = ClientResult({"w": torch.tensor(UPLOADS[key])}, 1.0, {})
            result, size = self.uplink.send(result, client, key)
            self.states.put(client, key, result.state)
            total, sent = total + result.update["w"], sent + size
            clients.append(TrainedClient(client, 1.0, 0.0))
        return RoundOutput({"w": total / len(cohort)}, clients=clients, bytes_up=sent)

    def round_metrics(self, output, payload):
        return round_metrics(output, payload)


def top1_with_error_feedback(updates: list[list[float]]) -> list[np.ndarray]:
    """What each of one client's launches sends, in launch order: top-1 of update + residual."""
    residual, sent = np.zeros(4), []
    for update in updates:
        corrected = np.array(update) + residual
        decoded = np.where(np.arange(4) == np.argmax(np.abs(corrected)), corrected, 0.0)
        residual = corrected - decoded
        sent.append(decoded)
    return sent


def test_each_arrival_is_encoded_with_the_residual_of_its_clients_previous_launch(tmp_path):
    states = ClientStateStore(tmp_path)
    recall = lambda c, r: states.get(c, before_round=r)  # noqa: E731 (the worker's)
    config = job(algorithm={"name": "fedavg"})
    engine = WorkerLike(
        job=config,
        algorithm=build_algorithm(config),
        info=None,
        robust=None,
        states=states,
        uplink=Uplink(ErrorFeedback(TopSparse(0.25)), "", 0, recall),
    )
    flight = lambda launch, client, version: Flight(  # noqa: E731
        launch, client, version, 0.0, 1.0, Outcome(REPORTED, 1.0, 1)
    )
    # at step 1: client 5 from version 1 first, then client 1 twice: launch 0 (version 0), and
    # launch 4 (version 1), which must train after launch 0, though its version's group came first
    arrived = [flight(3, 5, 1), flight(0, 1, 0), flight(4, 1, 1)]
    assert [[f.launch for f in g] for g in batches(arrived)] == [[3], [0], [4]]
    versions = {v: ServerState({"w": torch.zeros(4)}) for v in (0, 1)}
    fedbuff = AsynchronyConfig(kind="fedbuff", concurrency=3, buffer_size=3)
    state, metrics = server_step(engine, fedbuff, versions[1], versions, arrived, step=1)
    [client5] = top1_with_error_feedback([UPLOADS[3]])
    first, second = top1_with_error_feedback([UPLOADS[0], UPLOADS[4]])
    s0, s1 = 1.0, 2**-0.5  # staleness 0 and 1
    expected = -(s0 * client5 + s1 * first + s0 * second) / 3  # server lr 1: x - mean delta
    assert np.allclose(state.params["w"].numpy(), expected, atol=1e-6)
    assert metrics["sys/bytes_up"] == 3 * (4 + 1)  # each: one float32 value and one 2-bit index
