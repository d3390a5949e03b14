"""The contract's two shapes: a round-loop plugin, or a staged one (``protocol``) that defines only
what its protocol and the workers use; the engine's defaults for what a staged plugin leaves out,
and the one error that names what a plugin of neither shape lacks."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from raysim import registry
from raysim.aggregate import Gather, Sum
from raysim.algorithm import check_shape, has_protocol, runs_rounds
from raysim.plugin_defaults import aggregator_of, first_payload, fresh_state
from raysim.types import ClientResult, DataSpec, RunInfo, ServerState

INFO = RunInfo(4, 2, 1, DataSpec("classification", (2,), 2), seed=0, buffer_keys=frozenset({"bn"}))
PARAMS = {"weight": torch.arange(4.0).reshape(2, 2), "bn": torch.ones(2)}


class Options(BaseModel, frozen=True, extra="forbid"):
    pass


class StagedOnly:
    """A staged plugin with nothing but what the contract requires of one."""

    Config = Options

    def __init__(self, config: Options) -> None:
        self.config = config

    def client_update(self, ctx):
        return ClientResult({}, 1.0)

    def protocol(self, services, state):
        return state


class NoClientUpdate:
    Config = Options

    def protocol(self, services, state):
        return state


class NoServerUpdate:
    Config = Options

    def init(self, params, info):
        return ServerState(params)

    def payload(self, state, round_num, info): ...

    def client_update(self, ctx): ...

    def aggregator(self):
        return Sum()


def test_a_staged_plugin_needs_only_client_update_and_protocol():
    check_shape("staged", StagedOnly(Options()))  # no error
    assert has_protocol(StagedOnly(Options())) and not runs_rounds(StagedOnly(Options()))


def test_a_staged_plugin_without_client_update_is_refused_naming_it_alone():
    with pytest.raises(TypeError) as error:
        check_shape("broken", NoClientUpdate())
    message = str(error.value)
    assert "algorithm 'broken': NoClientUpdate lacks client_update;" in message
    assert "payload" not in message.split(";")[0]  # a staged plugin needs no round-loop method


def test_a_round_loop_plugin_without_server_update_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"NoServerUpdate lacks server_update;"):
        check_shape("half", NoServerUpdate())


def shipped(entry):
    """Whether the plugin is one of raysim's own: defined in a file of its algorithms/ folder, not
    by a test, which may register a broken one on purpose in this process's registry."""
    source = getattr(sys.modules.get(entry.factory.__module__), "__file__", None) or ""
    return Path(source).resolve().parent == (registry.builtin_root() / "algorithms").resolve()


def test_every_shipped_algorithm_has_one_of_the_two_shapes_and_the_staged_ones_are_listed():
    entries = [entry for entry in registry.entries("algorithm") if shipped(entry)]
    assert len(entries) >= 30  # the folder's plugins were found
    for entry in entries:
        if isinstance(entry.factory, type) and "__getattr__" not in vars(entry.factory):  # not a wrapper
            check_shape(entry.name, entry.factory)
    staged = {e.name for e in registry.entries("algorithm") if has_protocol(e.factory)}
    assert {"oneshot_fedavg", "ensemble", "feddf", "dense", "fusefl", "local"} <= staged
    for name in ("oneshot_fedavg", "ensemble", "feddf", "dense", "fusefl"):  # no dead methods left
        factory = registry.get("algorithm", name).factory
        assert not hasattr(factory, "server_update") and not hasattr(factory, "aggregator"), name


def test_without_init_a_staged_run_starts_from_a_copy_of_the_initial_params_and_no_extra():
    state = fresh_state(StagedOnly(Options()), PARAMS, INFO)
    assert state.extra is None and state.buffer_keys == {"bn"}
    assert all(torch.equal(state.params[k], PARAMS[k]) for k in PARAMS)
    state.params["weight"].add_(1.0)  # a copy: the initial model stays as built
    assert PARAMS["weight"][0, 0] == 0.0


def test_a_plugins_own_init_aggregator_and_payload_win_over_the_defaults():
    plugin = NoServerUpdate()
    assert fresh_state(plugin, PARAMS, INFO).params is PARAMS
    assert isinstance(aggregator_of(plugin), Sum)
    assert first_payload(plugin, ServerState(PARAMS), INFO) is None  # its payload, whatever it returns


def test_without_an_aggregator_train_cohort_gathers():
    assert isinstance(aggregator_of(StagedOnly(Options())), Gather)


def test_without_a_payload_the_first_cohort_receives_the_initial_params_or_none_when_models_mix():
    payload = first_payload(StagedOnly(Options()), ServerState(PARAMS), INFO)
    assert payload.extra is None and np.array_equal(payload.params["weight"], PARAMS["weight"].numpy())
    mixed = RunInfo(2, 2, 1, INFO.spec, seed=0, client_models=({"name": "mlp"}, {"name": "cnn"}))
    assert first_payload(StagedOnly(Options()), ServerState(PARAMS), mixed).params == {}
