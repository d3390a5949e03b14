"""IMA (Zhou et al., IEEE TMC 2024, arXiv:2305.07845) against an independent numpy reference.

The server is driven with given mean deltas d_t (what FedAvg-family clients aggregate to), so the
FMA model of round t is w^t = g_{t-1} - d_t, with g the broadcast model. IMA paper, Eq. (5) and
Algorithm 1: H keeps the last P FMA models from round 0; g_t = mean(H) from t_s on, g_t = w^t before.
FedAdam (Reddi et al., Algorithm 2; no bias correction, v starts at tau^2) steps on the
pseudo-gradient g - target: target = w^t (plain FedAdam), mean(H) from t_s with
``before_server_optimizer`` (the authors' code's order); with ``after_server_update`` H holds the
Adam outputs.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad

from raysim import registry
from raysim.checkpoint import CheckpointTrail, save_checkpoint
from raysim.config import validate_job
from raysim.errors import CheckpointError, ConfigError
from raysim.plugin_defaults import pseudo_gradient
from raysim.registry import plugin_config
from raysim.stored import plain
from raysim.types import RunInfo, ServerState

TS, WINDOW, LR, DECAY = 3, 2, 0.1, 0.9
RNG = np.random.default_rng(0)
# float32 deltas, as the engine aggregates them; the reference computes in float64 from them
DELTAS = [
    {
        "weight": RNG.normal(0, 0.1, (2, 2)).astype(np.float32),
        "bias": RNG.normal(0, 0.1, 2).astype(np.float32),
    }
    for _ in range(7)
]
ADAM = {"lr": 0.01, "b1": 0.9, "b2": 0.99, "tau": 1e-3}

INFO = RunInfo(num_clients=4, cohort_size=2, num_rounds=7, spec=SPEC, seed=0)  # the run's facts


def make(inner="fedavg", **options):
    entry = registry.get("algorithm", "ima")
    section = {"name": inner, "local": {"lr": LR, "lr_decay": DECAY, "batch_size": 1}}
    options = {"inner": section, "average_from": TS, "window": WINDOW, **options}
    return entry.factory(plugin_config(entry.config, options))


def init_state(plugin):
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    return plugin.init(params, RunInfo(num_clients=4, cohort_size=2, num_rounds=7, spec=SPEC, seed=0))


def as_torch(params):
    return {k: torch.from_numpy(v.copy()) for k, v in params.items()}


def start():
    return {
        "weight": np.asarray(W0, np.float32).astype(np.float64),
        "bias": np.asarray(B0, np.float32).astype(np.float64),
    }


def mean(window):
    return {k: np.mean([w[k] for w in window], axis=0) for k in window[-1]}


def distance(a, b):
    return np.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a))


def adam_step(w, target, m, v):
    """One FedAdam step toward ``target`` (pseudo-gradient w - target), per key."""
    new_w, new_m, new_v = {}, {}, {}
    for k in w:
        g = w[k] - target[k]
        new_m[k] = ADAM["b1"] * m[k] + (1 - ADAM["b1"]) * g
        new_v[k] = ADAM["b2"] * v[k] + (1 - ADAM["b2"]) * g**2
        new_w[k] = w[k] - ADAM["lr"] * new_m[k] / (np.sqrt(new_v[k]) + ADAM["tau"])
    return new_w, new_m, new_v


def assert_close(params, expected):
    for k, v in expected.items():
        np.testing.assert_allclose(params[k].double().numpy(), v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_global_model_is_the_mean_of_the_last_p_fma_models_from_average_from():
    plugin = make()
    state = init_state(plugin)
    g, window = start(), []
    for t, delta in enumerate(DELTAS):
        state, metrics = plugin.server_update(state, as_torch(delta), t, INFO)
        fma = {k: g[k] - delta[k] for k in g}
        window = [*window, fma][-WINDOW:]
        g = mean(window) if t >= TS else fma
        assert_close(state.params, g)
        assert metrics["ima/active"] == float(t >= TS)
        assert metrics["ima/shift_norm"] == pytest.approx(distance(fma, g), abs=1e-6)
        assert len(state.extra.window) == min(t + 1, WINDOW)  # filled from round 0
    assert metrics["ima/shift_norm"] > 0.01  # the average did move the model


def test_a_part_filled_window_is_never_averaged():
    """t_s = 1 < P - 1 = 2: the author code averages only full windows, so round 1 is still FMA."""
    plugin = make(window=3, average_from=1)
    state = init_state(plugin)
    g, window = start(), []
    for t, delta in enumerate(DELTAS[:4]):
        state, metrics = plugin.server_update(state, as_torch(delta), t, INFO)
        fma = {k: g[k] - delta[k] for k in g}
        window = [*window, fma][-3:]
        g = mean(window) if t >= 2 else fma
        assert_close(state.params, g)
        assert metrics["ima/active"] == float(t >= 2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"average_from": 7}, r"algorithm.average_from: .*set average_from below 7 \(the paper takes 3T/4"),
        ({"average_from": 2, "window": 8}, "algorithm.window: .*set window to at most 7"),
    ],
)
def test_an_ima_that_would_never_average_is_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        init_state(make(**options))  # 7 rounds: 0 to 6
    init_state(make(average_from=6, window=7))  # averages in the last round


def test_before_average_from_ima_is_its_inner_algorithm_bit_for_bit():
    plugin, fedavg = make(), registry.get("algorithm", "fedavg").factory(make().inner.config)
    state = init_state(plugin)
    plain = fedavg.init(state.params, RunInfo(num_clients=4, cohort_size=2, num_rounds=7, spec=SPEC, seed=0))
    for t in range(TS):
        state, _ = plugin.server_update(state, as_torch(DELTAS[t]), t, INFO)
        plain, _ = fedavg.server_update(plain, as_torch(DELTAS[t]), t, INFO)
        assert all(torch.equal(state.params[k], plain.params[k]) for k in plain.params)


@pytest.mark.parametrize("reset", [False, True])
def test_before_server_optimizer_adam_steps_toward_the_window_mean(reset):
    plugin = make("fedadam", placement="before_server_optimizer", reset_server_opt_state=reset)
    state = init_state(plugin)
    w, window = start(), []
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.full_like(x, ADAM["tau"] ** 2) for k, x in w.items()}
    for t, delta in enumerate(DELTAS):
        state, metrics = plugin.server_update(state, as_torch(delta), t, INFO)
        fma = {k: w[k] - delta[k] for k in w}  # the pure aggregate
        window = [*window, fma][-WINDOW:]
        target = mean(window) if t >= TS else fma
        if reset and t == TS:  # fresh moments, as at round 0
            m = {k: np.zeros_like(x) for k, x in m.items()}
            v = {k: np.full_like(x, ADAM["tau"] ** 2) for k, x in v.items()}
        w, m, v = adam_step(w, target, m, v)
        assert_close(state.params, w)
        assert metrics["ima/shift_norm"] == pytest.approx(distance(fma, target), abs=1e-6)
    assert_close(state.opt_state["m"], m)


def test_after_server_update_averages_the_adam_outputs():
    plugin = make("fedadam")
    state = init_state(plugin)
    g, window = start(), []
    m = {k: np.zeros_like(x) for k, x in g.items()}
    v = {k: np.full_like(x, ADAM["tau"] ** 2) for k, x in g.items()}
    for t, delta in enumerate(DELTAS):
        state, _ = plugin.server_update(state, as_torch(delta), t, INFO)
        adam, m, v = adam_step(g, {k: g[k] - delta[k] for k in g}, m, v)
        window = [*window, adam][-WINDOW:]
        g = mean(window) if t >= TS else adam
        assert_close(state.params, g)


def local_lr(plugin, round_num):
    """The lr of one SGD step on one example: the delta is lr * gradient."""
    x, y = np.array([[1.0, 2.0]]), np.array([0])
    ctx = context(x, y, plugin.payload(init_state(plugin), round_num, INFO))
    result = plugin.client_update(replace(ctx, round_num=round_num))
    gw, _ = grad(W0, B0, x, y)
    return float(result.update["weight"][0, 0]) / gw[0, 0], result.metrics["train/steps"]


def test_client_exploration_switches_the_lr_decay_at_average_from():
    explored, kept = make(), make(exploration=None)
    for t in (0, TS - 1, TS, TS + 3):
        late = LR * DECAY**TS * 0.97 ** (t - TS)
        assert local_lr(explored, t)[0] == pytest.approx(LR * DECAY**t if t < TS else late, rel=1e-4)
        assert local_lr(kept, t)[0] == pytest.approx(LR * DECAY**t, rel=1e-4)  # Table III's NAD


def test_other_exploration_schedules_and_epoch_decay():
    small = make(exploration={"kind": "constant", "lr": 1e-3})
    assert local_lr(small, TS - 1)[0] == pytest.approx(LR * DECAY ** (TS - 1), rel=1e-4)
    assert local_lr(small, TS + 2)[0] == pytest.approx(1e-3, rel=1e-4)
    entry = registry.get("algorithm", "ima")
    fewer = entry.factory(
        plugin_config(
            entry.config,
            {
                "inner": {"name": "fedavg", "local": {"epochs": 3, "batch_size": 1}},
                "average_from": TS,
                "epochs_exploration": {"every": 2},
            },
        )
    )
    assert [local_lr(fewer, t)[1] for t in (TS - 1, TS + 1, TS + 2, TS + 4, TS + 9)] == [3, 3, 2, 1, 1]


def test_the_config_round_trips_without_exploring_twice():
    plugin = make()
    section = {"name": "ima", **plugin.config.model_dump(mode="json")}
    assert section["inner"]["name"] == "fedavg" and section["inner"]["local"]["lr_decay"] == DECAY
    entry = registry.get("algorithm", "ima")
    again = entry.factory(plugin_config(entry.config, {k: v for k, v in section.items() if k != "name"}))
    assert again.config == plugin.config
    schedule = again.inner.config.local.lr_schedule  # what a worker trains with
    assert schedule.kind == "switch" and schedule.before.kind == "exponential"


def test_inner_hooks_pass_through():
    scaffold, fedavg = make("scaffold", placement="after_server_update"), make()
    assert scaffold.pseudo_gradient == scaffold.inner.pseudo_gradient
    assert not hasattr(fedavg, "pseudo_gradient")
    delta = as_torch(DELTAS[0])
    assert pseudo_gradient(fedavg, delta, init_state(fedavg).params) is delta  # a mean delta


def job(algorithm):
    return {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": algorithm}


def problems(algorithm):
    with pytest.raises(ConfigError) as info:
        validate_job(job({"name": "ima", "average_from": 5, **algorithm}))
    return info.value.problems


def test_inner_config_errors_name_the_inner_key():
    found = problems({"inner": {"name": "fedprox", "mu": -1, "local": {"lrr": 0.1}}, "window": 0})
    assert any(p.startswith("algorithm.inner.mu: ") for p in found)
    assert any(p.startswith("algorithm.inner.local.lrr: unknown key; did you mean 'lr'?") for p in found)
    assert any(p.startswith("algorithm.window: ") for p in found)  # reported with the inner's
    [unknown] = problems({"inner": {"name": "fedavgg"}})
    assert unknown.startswith("algorithm.inner.name: unknown algorithm 'fedavgg'; did you mean 'fedavg'?")
    [both] = problems(
        {"inner": {"name": "fedavg", "local": {"lr_decay": 0.9, "lr_schedule": {"kind": "constant"}}}}
    )
    assert both.startswith("algorithm.inner.local: set lr_decay or lr_schedule, not both")


def test_what_ima_cannot_wrap_is_refused(monkeypatch):
    assert "not itself" in problems({"inner": {"name": "ima"}})[0]
    staged = type("StagedTest", (), {"protocol": lambda self, services, state: state})
    fedavg_config = registry.get("algorithm", "fedavg").config
    monkeypatch.setitem(registry._entries["algorithm"], "staged_for_ima_test", None)  # gone at teardown
    registry.register("algorithm", "staged_for_ima_test", config=fedavg_config)(staged)
    assert "runs its own protocol" in problems({"inner": {"name": "staged_for_ima_test"}})[0]
    [sums] = problems({"inner": {"name": "scaffold"}, "placement": "before_server_optimizer"})
    assert sums.startswith("algorithm: placement before_server_optimizer") and "after_server_update" in sums


def parent_trail(tmp_path, last, missing=()):
    """A FedAvg run's per-round checkpoints: the model after round r is W0 + r."""
    states = {
        r: ServerState(params={"weight": torch.tensor(W0).float() + r, "bias": torch.tensor(B0).float() + r})
        for r in range(last + 1)
    }
    for r, state in states.items():
        if r not in missing:
            save_checkpoint(tmp_path / f"round_{r:05d}.pt", state, r, {})
    return CheckpointTrail(tmp_path / f"round_{last:05d}.pt", last, states[last])


def test_a_branch_fills_the_window_with_the_parents_last_models(tmp_path):
    plugin = make(window=3, average_from=4)
    trail = parent_trail(tmp_path, 3)
    state = plugin.resume_state(trail.state, init_state(plugin), trail)
    assert [float(w["bias"][0] - B0[0]) for w in state.extra.window] == pytest.approx([1, 2, 3])
    assert state.params is trail.state.params
    saved = replace(state, extra=plain(state.extra))  # as a checkpoint holds it
    own = plugin.resume_state(saved, init_state(plugin), trail)  # an IMA checkpoint keeps its own
    assert [float(w["bias"][0] - B0[0]) for w in own.extra.window] == pytest.approx([1, 2, 3])


def test_a_branch_early_in_the_parent_has_a_shorter_window(tmp_path):
    trail = parent_trail(tmp_path, 1)
    state = make(window=3, average_from=4).resume_state(trail.state, init_state(make()), trail)
    assert len(state.extra.window) == 2  # rounds 0 and 1, as a run from round 0 has


def test_branches_that_cannot_fill_the_window_are_refused(tmp_path):
    trail = parent_trail(tmp_path, 3, missing=(2,))
    with pytest.raises(CheckpointError, match=r"round 2 .*checkpoint_every: 1"):
        make(window=3, average_from=4).resume_state(trail.state, init_state(make()), trail)
    with pytest.raises(CheckpointError, match="branch from the checkpoint of round 2"):
        make(window=1, average_from=3).resume_state(trail.state, init_state(make()), trail)
    before = make("fedadam", placement="before_server_optimizer", average_from=4)
    with pytest.raises(CheckpointError, match="pure aggregates"):
        before.resume_state(trail.state, init_state(before), trail)


def test_the_job_check_reports_average_from_and_window_at_load_all_at_once():
    ima = {"name": "ima", "average_from": 75, "window": 5, "inner": {"name": "fedavg"}}
    with pytest.raises(ConfigError) as info:  # the dry run loads the job, so it stops here too
        validate_job({**job(ima), "engine": {"num_rounds": 3}})
    assert [p.split(":")[0] for p in info.value.problems] == ["algorithm.average_from", "algorithm.window"]
    with pytest.raises(ConfigError) as info:  # with another section's typo, in the same error
        validate_job({**job(ima), "engine": {"num_rounds": 3}, "model": {"name": "mlp", "hiden": [8]}})
    keys = [p.split(":")[0] for p in info.value.problems]
    assert keys == ["model.hiden", "algorithm.average_from", "algorithm.window"]
    validate_job({**job(ima), "engine": {"num_rounds": 76}})  # averages in the last round
