"""FedFomo against a numpy reference on the linear softmax classifier of ``reference.py``.

A client at theta_i = (W0, B0) with 10 examples keeps 2 (20%) for validation, rows 4 and 8: the
seeded choice of ``raysim.sampling.split_validation`` for run seed 0 and client 0, the same every
round (tested below on its own), where the old split took the tail, rows 8 and 9. Each peer n
gets w_n = max(0, (L(theta_i) - L(theta_n)) / ||theta_n - theta_i||), L the mean cross-entropy on
the validation examples; the client moves to theta_i + sum_n w_n (theta_n - theta_i) / sum_n w_n,
then takes one full-batch SGD step on its 8 other examples (``reference.grad``).
"""

import importlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad, payload

from raysim import registry
from raysim.types import ClientData, RunInfo

LR = 0.3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(10, 2))
Y = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 0])

INFO = RunInfo(4, 2, 3, SPEC, 0)  # the run's facts
VAL = [4, 8]  # split_validation(10, 2, seed 0, client 0)'s choice, checked in the split's own test
TRAIN = [i for i in range(10) if i not in VAL]


def algo(**options):
    entry = registry.get("algorithm", "fedfomo")
    local = {"lr": LR, "batch_size": 16, "epochs": 1}
    return entry.factory(entry.config.model_validate({"local": local, **options}))


def ce(w, b, x, y):
    z = x @ w.T + b
    z = z - z.max(1, keepdims=True)
    return float(-(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1))).mean())


def tensors(w, b):
    return {"weight": torch.tensor(w, dtype=torch.float32), "bias": torch.tensor(b, dtype=torch.float32)}


def reference(own, peers):
    xv, yv, xt, yt = X[VAL], Y[VAL], X[TRAIN], Y[TRAIN]
    own_loss = ce(*own, xv, yv)
    weights = []
    for w, b in peers:
        dist = np.sqrt(((w - own[0]) ** 2).sum() + ((b - own[1]) ** 2).sum())
        weights.append(max(0.0, (own_loss - ce(w, b, xv, yv)) / dist))
    weights = np.array(weights)
    w, b = own
    if weights.sum() > 0:
        share = weights / weights.sum()
        w = w + sum(s * (pw - w) for s, (pw, _) in zip(share, peers))
        b = b + sum(s * (pb - b) for s, (_, pb) in zip(share, peers))
    gw, gb = grad(w, b, xt, yt)
    return w - LR * gw, b - LR * gb, weights


GW, GB = grad(W0, B0, X[VAL], Y[VAL])  # the validation loss's gradient at theta_i
PEERS = [(W0 - 2.0 * GW, B0 - 2.0 * GB), (W0 + 0.5, B0 - 0.5), (W0 - GW, B0)]  # better, worse, better


def fomo_context(plugin, state=None, start=True):
    """Client 0 receiving peers 4, 5, 6 (and the initial model when ``start``), as tensors."""
    peers = importlib.import_module(type(plugin).__module__).Peers
    own_part = peers([4, 5, 6], [tensors(*p) for p in PEERS], tensors(W0, B0) if start else None, 0)
    return replace(context(X, Y, payload(), state=state), client_payload=own_part)


def test_a_newcomer_weighs_its_peers_moves_towards_them_and_trains():
    plugin = algo()
    result = plugin.client_update(fomo_context(plugin))
    w, b, weights = reference((W0, B0), PEERS)
    assert weights[0] > 0 and weights[1] == 0  # the reference itself: one peer helps, one does not
    assert np.allclose(result.update.weights.numpy(), weights, rtol=1e-4, atol=1e-6)
    assert np.allclose(result.update.model["weight"].numpy(), w, atol=1e-5)
    assert np.allclose(result.update.model["bias"].numpy(), b, atol=1e-5)
    assert result.update.peers == [4, 5, 6] and result.update.client_id == 0
    assert torch.equal(result.state.model["weight"], result.update.model["weight"]) and result.weight == 8


def test_a_returning_client_starts_from_its_own_model():
    plugin = algo()
    own = (W0 * 0.5, B0 + 0.2)
    result = plugin.client_update(fomo_context(plugin, plugin.ClientState(tensors(*own)), start=False))
    w, _, weights = reference(own, PEERS)
    assert np.allclose(result.update.weights.numpy(), weights, rtol=1e-4, atol=1e-6)
    assert np.allclose(result.update.model["weight"].numpy(), w, atol=1e-5)


def test_the_server_sends_top_affinity_peers_and_the_start_to_newcomers_only():
    plugin = algo(num_peers=2, epsilon=0.0)
    state = plugin.init(tensors(W0, B0), RunInfo(4, 2, 3, SPEC, 0))
    models = {str(c): tensors(W0 + c, B0) for c in (1, 2, 3)}
    memory = replace(state.extra, models=models, affinity={"1": {"3": 0.5, "2": 0.1}})
    state = replace(state, extra=memory)
    sent = plugin.client_payload(state, 0, 1, INFO)
    assert sent.ids == [3, 2] and sent.start is None  # highest affinity first; client 1 has a model
    assert np.allclose(sent.models[0]["weight"], W0 + 3)
    newcomer = plugin.client_payload(state, 0, 0, INFO)  # no affinity yet: a seeded random pair
    assert len(newcomer.ids) == 2 and 0 not in newcomer.ids and newcomer.start is not None
    assert plugin.client_payload(state, 0, 0, INFO).ids == newcomer.ids  # the same draw every time


def original_e_greedy(candidates, affinity, m, epsilon, rng):
    """NVlabs/FedFomo's ``get_federating_clients`` (e_greedy), written out: per slot one draw; an
    exploring slot pops the next of a random order, else the next of highest affinity; a peer
    already chosen is popped and skipped."""
    rand_clients = [int(j) for j in rng.permutation(candidates)]
    top = sorted(candidates, key=lambda j: (-affinity[str(j)], j))
    chosen = []
    for explore in rng.random(m):
        while True:
            peer = rand_clients.pop(0) if explore < epsilon else top.pop(0)
            if peer not in chosen:
                chosen.append(peer)
                break
    return chosen


@pytest.mark.parametrize("epsilon", [0.0, 0.5, 1.0])
def test_each_peer_slot_explores_with_probability_epsilon_as_the_authors_code(epsilon):
    from raysim.sampling import client_seed

    plugin = algo(num_peers=4, epsilon=epsilon, epsilon_decay=0.0)
    state = plugin.init(tensors(W0, B0), RunInfo(10, 2, 3, SPEC, 0))
    models = {str(c): tensors(W0 + c, B0) for c in range(1, 10)}
    affinity = {str(c): 0.1 * c for c in range(2, 10)}
    memory = replace(state.extra, models=models, affinity={"1": affinity})
    got = [plugin.choose_peers(memory, 7, r, 1) for r in range(20)]  # 7: the run seed
    candidates = list(range(2, 10))
    rngs = [np.random.default_rng(client_seed(7, r, 1)) for r in range(20)]
    assert got == [original_e_greedy(candidates, affinity, 4, epsilon, rng) for rng in rngs]
    if epsilon == 0.0:
        assert got[0] == [9, 8, 7, 6]
    mixed = sum(peers != [9, 8, 7, 6] for peers in got)
    assert (mixed == 0) == (epsilon == 0.0)


def test_the_server_keeps_each_model_and_adds_the_weights_to_the_affinity():
    plugin = algo()
    state = plugin.init(tensors(W0, B0), RunInfo(4, 2, 3, SPEC, 0))
    state = replace(state, extra=replace(state.extra, affinity={"0": {"4": 1.0}}))
    results = [(0, plugin.client_update(fomo_context(plugin)))]
    new, metrics = plugin.server_update(state, results, 0, INFO)
    weights = results[0][1].update.weights.tolist()
    assert new.extra.affinity["0"] == pytest.approx({"4": 1.0 + weights[0], "5": weights[1], "6": weights[2]})
    assert torch.equal(new.extra.models["0"]["weight"], results[0][1].update.model["weight"])
    assert metrics["fedfomo/num_models"] == 1 and torch.equal(new.params["weight"], state.params["weight"])


def test_a_client_without_peers_trains_from_its_start_whatever_the_worker_last_held():
    """Round 0: nobody has a model yet, so no peers; the resident model holds another client's
    weights, and the client must still start from the initial model it was sent."""
    plugin = algo()
    peers = importlib.import_module(type(plugin).__module__).Peers
    ctx = replace(context(X, Y, payload()), client_payload=peers([], [], tensors(W0, B0), 0))
    with torch.no_grad():
        ctx.model.weight.fill_(7.0)  # what ran last on the worker
    result = plugin.client_update(ctx)
    gw, gb = grad(W0, B0, X[TRAIN], Y[TRAIN])
    assert np.allclose(result.update.model["weight"].numpy(), W0 - LR * gw, atol=1e-5)
    assert result.update.weights.numel() == 0


def test_the_scoring_split_is_a_seeded_choice_per_client_the_same_every_round_not_the_tail():
    """A store that keeps a client's rows grouped (here the last 10 of 50 are all class 1) scored on
    the tail would score on one class. The split is ceil(0.2 n) rows drawn from the run seed and
    the client id: the same whatever the round (its own model never trains on them), another for
    another client or seed, disjoint from the training rows, each part in stored order."""
    module = importlib.import_module(type(algo()).__module__)
    rows = np.arange(50)
    data = ClientData({"x": rows[:, None].astype(np.float32), "y": (rows >= 40).astype(np.int64)})
    train, scoring = module.split_for_scoring(data, 0.2, 0, 3)
    got = scoring.arrays["x"][:, 0].astype(int)
    assert len(got) == 10 and not np.array_equal(got, rows[40:]) and 0 < scoring.arrays["y"].sum() < 10
    assert np.array_equal(got, np.sort(got))
    assert sorted([*got, *train.arrays["x"][:, 0].astype(int)]) == list(range(50))
    assert np.array_equal(module.split_for_scoring(data, 0.2, 0, 3)[1].arrays["x"], scoring.arrays["x"])
    assert not np.array_equal(module.split_for_scoring(data, 0.2, 0, 4)[1].arrays["x"], scoring.arrays["x"])
    assert not np.array_equal(module.split_for_scoring(data, 0.2, 1, 3)[1].arrays["x"], scoring.arrays["x"])
    small = ClientData({"x": X.astype(np.float32), "y": Y})
    assert np.array_equal(
        module.split_for_scoring(small, 0.2, 0, 0)[1].arrays["x"], X[VAL].astype(np.float32)
    )


def test_a_client_scores_its_peers_on_the_same_rows_in_every_round():
    """Rounds 0 and 5 of client 0 (another round, another training seed) weigh the peers alike:
    the scoring rows do not move with the round."""
    plugin = algo()
    ctx = fomo_context(plugin)
    later = replace(ctx, round_num=5, seed=12345)
    first, again = plugin.client_update(ctx), plugin.client_update(later)
    assert torch.equal(first.update.weights, again.update.weights)
    assert np.allclose(first.update.weights.numpy(), reference((W0, B0), PEERS)[2], rtol=1e-4, atol=1e-6)
