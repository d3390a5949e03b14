"""FedBuff under a robust rule (raysim/engine/async_robust.py): the rule sees a server step's whole
buffer, each update scaled by its staleness weight, and the server steps on its output; checked
against numpy's median of the hand-scaled updates."""

from types import SimpleNamespace

import numpy as np
import torch
from test_async_setup import job

from raysim.config.asynchrony import AsynchronyConfig
from raysim.engine.async_rounds import server_step
from raysim.gathered_updates import Gathered, flatten, template_of
from raysim.robust.release import RunRobust
from raysim.runtime.builders import build_algorithm
from raysim.systems.async_clock import Flight
from raysim.systems.rounds import REPORTED, Outcome
from raysim.types import RoundOutput, ServerState

UPDATES = {1: [1.0, -4.0], 2: [3.0, 2.0], 3: [-2.0, 6.0], 4: [5.0, 0.5]}  # each client's delta


class FakeEngine(SimpleNamespace):
    """Just what ``server_step`` reads; its clients send ``UPDATES``, kept whole (gathered)."""

    def train_cohort(self, payload, cohort, version, options):
        assert options.gathers and self.robust is None  # the rule waits for the whole buffer
        self.trained.append([int(c) for c in cohort])
        trees = [{"w": torch.tensor(UPDATES[int(c)])} for c in cohort]
        rows = Gathered(list(range(len(cohort))), [1.0] * len(cohort), [flatten(t) for t in trees])
        gathered = Gathered(rows.positions, rows.weights, rows.vectors, template_of(trees[0]))
        return RoundOutput(gathered, clients=[], failures=[], bytes_up=0, params_up=0)

    def round_metrics(self, output, payload):
        return {}


def test_fedbuffs_median_is_numpys_over_the_staleness_weighted_buffer_then_the_server_lr():
    config = job(
        algorithm={"name": "fedavg", "server": {"kind": "sgd", "lr": 0.5}}, robust={"rule": "median"}
    )
    robust = RunRobust.of(config, np.arange(20))
    engine = FakeEngine(job=config, algorithm=build_algorithm(config), info=None, robust=robust, trained=[])
    versions = {v: ServerState({"w": torch.tensor([float(v), 0.0])}) for v in (0, 1, 2)}
    arrived = [  # at step 2: clients 1 and 3 from version 0, 2 and 4 from version 1
        Flight(i, client, version, 0.0, 1.0, Outcome(REPORTED, 1.0, 1))
        for i, (client, version) in enumerate([(1, 0), (2, 1), (3, 0), (4, 1)])
    ]
    fedbuff = AsynchronyConfig(kind="fedbuff", concurrency=4, buffer_size=4)  # s(tau) = (1 + tau)^-0.5
    state, metrics = server_step(engine, fedbuff, versions[2], versions, arrived, step=2)
    assert engine.trained == [[1, 3], [2, 4]] and engine.robust is robust
    scale = {1: 3**-0.5, 3: 3**-0.5, 2: 2**-0.5, 4: 2**-0.5}  # staleness 2 and 1
    median = np.median([scale[c] * np.array(UPDATES[c]) for c in (1, 2, 3, 4)], axis=0)
    assert np.allclose(state.params["w"].numpy(), np.array([2.0, 0.0]) - 0.5 * median, atol=1e-6)
