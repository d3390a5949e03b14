"""Checkpoints and client state written before plugin state was typed still resume.

Until then a plugin's ``ServerState.extra`` and client state were plain dicts under string keys;
now they are frozen dataclasses that cross the weights-only boundary as the dict of their fields.
Each case below writes today's old layout by hand (the keys are spelled out here, not taken from
the plugins), saves it as a checkpoint or a client-state file, and reads it back the way a
resumed run does: the plugin's ``resume_state`` hook, then the engine's ``typed_like``.

Later, SCAFFOLD, FedDyn, FedFA and FedFomo stopped keeping run facts (the population, the seed) in
their server state, reading them from ``RunInfo``: their older checkpoints, which hold those fields
(the state's ``RETIRED_FIELDS``), resume without them, and today's resume as they are.
"""

import dataclasses

import pytest
import torch

from raysim import params as P
from raysim import registry
from raysim.checkpoint import CheckpointTrail, read_checkpoint, save_checkpoint
from raysim.engine.resumed_state import typed_like
from raysim.errors import CheckpointError
from raysim.plugin_defaults import resume_state
from raysim.runtime.client_state import ClientStateStore
from raysim.stored import from_plain
from raysim.types import DataSpec, RunInfo, ServerState

SPEC = DataSpec("classification", (2,), 2)
INFO = RunInfo(num_clients=4, cohort_size=2, num_rounds=10, spec=SPEC, seed=5)
W = {"weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "bias": torch.tensor([0.5, -0.5])}


def build(name, **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def scaled(s):
    return {k: v * s for k, v in W.items()}


def resumed(tmp_path, plugin, name, extra, opt_state=None):
    """The state a run resumes from a checkpoint whose plugin state is ``extra`` as written."""
    old = ServerState(P.clone(W), opt_state=opt_state or {}, extra=extra)
    path = save_checkpoint(tmp_path / "final.pt", old, round_num=2, job_dict={})
    saved = read_checkpoint(path).state
    fresh = plugin.init(P.clone(W), INFO)
    trail = CheckpointTrail(path, 2, saved)
    return typed_like(fresh, resume_state(plugin, saved, fresh, trail), name, str(path))


def same(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def fields(state):
    return [f.name for f in dataclasses.fields(state.extra)]


@pytest.mark.parametrize("old", [{"num_clients": 4}, {}])  # before and after N left the state
def test_scaffold_server_variate(tmp_path, old):
    state = resumed(tmp_path, build("scaffold"), "scaffold", {"c": scaled(0.1)} | old)
    assert same(state.extra.c, scaled(0.1)) and fields(state) == ["c"]


@pytest.mark.parametrize("old", [{"num_clients": 4}, {}])
def test_feddyn_server_correction(tmp_path, old):
    state = resumed(tmp_path, build("feddyn"), "feddyn", {"h": scaled(-0.2)} | old)
    assert same(state.extra.h, scaled(-0.2)) and fields(state) == ["h"]


@pytest.mark.parametrize("old", [{"anchor_seed": 5}, {}])
def test_fedfa_anchors(tmp_path, old):
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    state = resumed(tmp_path, build("fedfa"), "fedfa", {"anchors": anchors} | old)
    assert torch.equal(state.extra.anchors, anchors) and fields(state) == ["anchors"]


@pytest.mark.parametrize("old", [{"seed": 5}, {}])
def test_fedfomo_memory(tmp_path, old):
    memory = {"models": {"1": scaled(0.5)}, "affinity": {"1": {"2": 0.25}}}
    state = resumed(tmp_path, build("fedfomo"), "fedfomo", memory | old)
    assert same(state.extra.models["1"], scaled(0.5)) and state.extra.affinity == {"1": {"2": 0.25}}
    assert fields(state) == ["models", "affinity"]


def test_a_fresh_state_keeps_no_run_fact():
    """The population and the seed are ``RunInfo``'s, so a checkpoint never holds them."""
    for name, kept in [("scaffold", ["c"]), ("feddyn", ["h"]), ("fedfa", ["anchors"])]:
        assert fields(build(name).init(P.clone(W), INFO)) == kept
    assert fields(build("fedfomo").init(P.clone(W), INFO)) == ["models", "affinity"]


def test_moon_initial_model_and_no_state(tmp_path):
    initial = resumed(tmp_path, build("moon", negative="shared_init"), "moon", {"initial": scaled(2.0)})
    assert same(initial.extra.initial, scaled(2.0))
    assert resumed(tmp_path, build("moon"), "moon", {}).extra is None


def test_local_trained_clients(tmp_path):
    state = resumed(tmp_path, build("local"), "local", {"trained": torch.tensor([0, 3])})
    assert state.extra.trained.tolist() == [0, 3]


@pytest.mark.parametrize("name", ["fedfish", "fedrod", "fedprox"])
def test_plugins_without_server_state(tmp_path, name):
    assert resumed(tmp_path, build(name), name, {}).extra is None


@pytest.mark.parametrize("name, slots", [("fedavgm", {"m"}), ("fedadam", {"m", "v"})])
def test_server_optimizer_moments(tmp_path, name, slots):
    opt_state = {"step": 3} | {slot: scaled(0.3) for slot in slots}
    state = resumed(tmp_path, build(name), name, {}, opt_state)
    assert state.opt_state["step"] == 3 and all(same(state.opt_state[s], scaled(0.3)) for s in slots)


def test_ima_window_beside_its_inners_keys(tmp_path):
    """IMA kept its window under "ima_window" among the inner algorithm's own keys."""
    plugin = build("ima", inner={"name": "scaffold"}, window=2, average_from=5)
    old = {"c": scaled(0.1), "num_clients": 4, "ima_window": [scaled(1.0), scaled(2.0)]}
    state = resumed(tmp_path, plugin, "ima", old)
    assert same(state.extra.inner.c, scaled(0.1)) and not hasattr(state.extra.inner, "num_clients")
    assert [float(m["bias"][0]) for m in state.extra.window] == [0.5, 1.0]


def test_ima_over_fedavg_keeps_only_its_window(tmp_path):
    plugin = build("ima", inner={"name": "fedavg"}, window=2, average_from=5)
    state = resumed(tmp_path, plugin, "ima", {"ima_window": [scaled(1.0)]})
    assert state.extra.inner is None and len(state.extra.window) == 1


def test_a_checkpoint_of_other_state_is_refused_naming_both(tmp_path):
    with pytest.raises(CheckpointError, match=r"holds \['h', 'num_clients'\], but ScaffoldServer keeps"):
        resumed(tmp_path, build("scaffold"), "scaffold", {"h": scaled(0.1), "num_clients": 4})
    # a retired field excuses only itself: a field neither kept nor retired is still refused
    with pytest.raises(CheckpointError, match=r"holds \['c', 'num_clients', 'seed'\], but ScaffoldServer"):
        resumed(tmp_path, build("scaffold"), "scaffold", {"c": scaled(0.1), "num_clients": 4, "seed": 5})
    with pytest.raises(CheckpointError, match=r"holds \['num_clients'\], but ScaffoldServer keeps \['c'\]"):
        resumed(tmp_path, build("scaffold"), "scaffold", {"num_clients": 4})
    with pytest.raises(CheckpointError, match="another kind of algorithm than 'fedavg'"):
        resumed(tmp_path, build("fedavg"), "fedavg", {"c": scaled(0.1)})


@pytest.mark.parametrize(
    "name, options, old",
    [
        ("scaffold", {}, {"c_i": scaled(0.1)}),
        ("feddyn", {}, {"g": scaled(0.2)}),
        ("moon", {}, {"previous": scaled(0.3)}),
        ("fedrod", {}, {"head": scaled(0.4)}),
        ("local", {}, {"params": scaled(0.5)}),
        ("ima", {"inner": {"name": "scaffold"}, "average_from": 5}, {"c_i": scaled(0.6)}),
    ],
)
def test_client_state_written_as_a_dict_reads_back_as_the_plugins_type(tmp_path, name, options, old):
    """The worker reads the store's dict and rebuilds the plugin's ``ClientState`` from it."""
    store = ClientStateStore(tmp_path / "client_state")
    store.put(7, 1, old)
    plugin = build(name, **options)
    state = from_plain(plugin.ClientState, store.get(7, before_round=2), "client 7's state")
    (field,) = old
    assert isinstance(state, plugin.ClientState) and same(getattr(state, field), old[field])


def test_client_state_of_another_plugin_is_refused_naming_both(tmp_path):
    store = ClientStateStore(tmp_path / "client_state")
    store.put(7, 1, {"g": scaled(0.2)})  # FedDyn's, read by SCAFFOLD
    with pytest.raises(ValueError, match=r"holds \['g'\], but ClientVariate keeps \['c_i'\]"):
        from_plain(build("scaffold").ClientState, store.get(7, before_round=2), "client 7's state")


def test_typed_client_state_is_stored_as_the_dict_of_its_fields(tmp_path):
    store = ClientStateStore(tmp_path / "client_state")
    plugin = build("scaffold")
    store.put(7, 1, plugin.ClientState(scaled(0.1)))
    raw = store.get(7, before_round=2)
    assert set(raw) == {"c_i"} and same(raw["c_i"], scaled(0.1))
