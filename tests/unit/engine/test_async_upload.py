"""``compression.upload`` under asynchrony (raysim/engine/async_rounds.py): each arrival is encoded
as the worker encodes a synchronous round's update, its error-feedback residual read and written
under its launch (``RoundOptions.state_keys``), so a client's launches pass the residual on in
launch order, whatever order the step's groups train in; checked against error-feedback top-k
worked by hand, and ``sys/bytes_up`` counted exactly."""

from types import SimpleNamespace

import numpy as np
import torch
from test_async_setup import job

from raysim.compress.codec import ErrorFeedback
from raysim.compress.sparse import TopSparse
from raysim.compress.upload import Uplink
from raysim.config.asynchrony import AsynchronyConfig
from raysim.engine.async_rounds import batches, server_step
from raysim.engine.metrics import round_metrics
from raysim.runtime.builders import build_algorithm
from raysim.runtime.client_state import ClientStateStore
from raysim.systems.async_clock import Flight
from raysim.systems.rounds import REPORTED, Outcome
from raysim.types import ClientResult, RoundOutput, ServerState, TrainedClient

UPDATES = {0: [4.0, -1.0, 0.5, 2.0], 3: [1.0, 3.0, -0.5, 0.25], 4: [0.5, 0.5, 2.5, -3.0]}  # by launch


class WorkerLike(SimpleNamespace):
    """Trains a cohort as a worker does under ``compression.upload``: each update encoded by the
    uplink, the client's state kept under the key ``state_keys`` gives (top-k 1 of 4, error feedback)."""

    def train_cohort(self, payload, cohort, version, options):
        total, clients, sent = torch.zeros(4), [], 0
        for client in (int(c) for c in cohort):
            key = options.state_keys[client]
            result = ClientResult({"w": torch.tensor(UPDATES[key])}, 1.0, {})
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
    [client5] = top1_with_error_feedback([UPDATES[3]])
    first, second = top1_with_error_feedback([UPDATES[0], UPDATES[4]])
    s0, s1 = 1.0, 2**-0.5  # staleness 0 and 1
    expected = -(s0 * client5 + s1 * first + s0 * second) / 3  # server lr 1: x - mean delta
    assert np.allclose(state.params["w"].numpy(), expected, atol=1e-6)
    assert metrics["sys/bytes_up"] == 3 * (4 + 1)  # each: one float32 value and one 2-bit index
