"""FedBuff under a robust rule (raysim/engine/async_robust.py): the rule sees a server step's whole
buffer, each update scaled by its staleness weight, and the server steps on its output; checked
against numpy's median of the hand-scaled updates."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_async_setup import job

from raysim.config.asynchrony import AsynchronyConfig
from raysim.config.robust import ALIE, Krum, MultiKrum
from raysim.engine.async_robust import release_buffer, stacked
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


# an outside review: rows scaled by s(tau) before Krum made a shrunk (stale) row near every other,
# so Krum chose the stalest; row 4 is the stale one, and Krum over the scaled rows would choose it
ROWS = np.array([[2.0, 0.5], [-2.0, 0.0], [0.5, 2.0], [0.0, -2.5], [3.0, 3.0]], dtype=np.float32)
SCALES = np.array([1.0, 1.0, 1.0, 1.0, 0.1])  # rows 0-3 fresh, row 4 stale


def groups(fresh=4):
    """A fresh group (clients 1 to ``fresh``, rows 0 on) and a stale one (s = 0.1: the rest, to
    client 5), as ``server_step`` hands them over."""

    def output(part):
        trees = [{"w": torch.tensor(row)} for row in part]
        rows = Gathered(list(range(len(part))), [1.0] * len(part), [flatten(t) for t in trees])
        return RoundOutput(
            Gathered(rows.positions, rows.weights, rows.vectors, template_of(trees[0])),
            clients=[],
            failures=[],
        )

    ids = [1, 2, 3, 4, 5]
    return [(1.0, ids[:fresh], output(ROWS[:fresh])), (0.1, ids[fresh:], output(ROWS[fresh:]))]


def numpy_krum_choice(x, f, m):
    n = len(x)
    scores = [sorted(float(((x[i] - x[j]) ** 2).sum()) for j in range(n) if j != i) for i in range(n)]
    return np.argsort([sum(s[: n - f - 2]) for s in scores], kind="stable")[:m]


@pytest.mark.parametrize(("m", "rows"), [(1, [0]), (2, [0, 2]), (3, [0, 2, 4])])
def test_krum_chooses_among_the_rows_as_sent_and_averages_the_chosen_rows_scaled(m, rows):
    rule = Krum(rule="krum", f=1) if m == 1 else MultiKrum(rule="multi_krum", f=1, m=m)
    robust = RunRobust(rule, None, frozenset(), attacked=False)
    released = release_buffer(robust, groups(), step=3)
    chosen = numpy_krum_choice(ROWS.astype(np.float64), f=1, m=m)
    assert list(numpy_krum_choice(ROWS * SCALES[:, None], f=1, m=1)) == [4]
    assert list(chosen) == rows  # the scaled rows' Krum would take row 4 first
    expected = (SCALES[chosen, None] * ROWS[chosen]).mean(0)
    np.testing.assert_allclose(released.aggregate["w"].numpy(), expected, rtol=1e-6)
    assert robust.metrics()["robust/selected"] == m


def test_a_stale_alie_attacker_is_scaled_by_its_own_staleness_weight():
    # the attacker (client 5, stale) writes mean - z std of the honest rows as sent, then its row
    # counts s(tau) times, as every other stale update does (the review found it at full weight)
    robust = RunRobust(None, ALIE(kind="alie", fraction=0.2, z=1.0), frozenset({5}), attacked=True)
    released = release_buffer(robust, groups(fresh=3), step=3)  # client 4 (row 3) stale and honest
    honest = ROWS[:4].astype(np.float64)
    attacker = honest.mean(0) - honest.std(0, ddof=1)
    expected = (honest[:3].sum(0) + 0.1 * honest[3] + 0.1 * attacker) / 5
    np.testing.assert_allclose(released.aggregate["w"].numpy(), expected, rtol=1e-6)
    assert robust.metrics()["attack/malicious_in_cohort"] == 1.0


def test_the_buffer_holds_the_groups_rows_themselves_with_their_staleness_weights():
    # the driver keeps two copies of the rows (the groups' and the rule's stack), as a synchronous
    # round does; scaled copies made a third (an outside review)
    parts = groups(fresh=3)
    rows, scales = stacked(parts)
    assert all(a is b for a, b in zip(rows.vectors, [v for _, _, o in parts for v in o.aggregate.vectors]))
    assert rows.positions == [0, 1, 2, 3, 4] and scales == [1.0, 1.0, 1.0, 0.1, 0.1]
