"""A staged plugin that defines only Config, client_update and protocol runs end to end (serial):
it starts from the initial model, its cohort's results come gathered in cohort order, and a plugin
without client_update is refused before any worker starts, naming it."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from jobs import tiny_job
from raysim import params as P
from raysim import registry
from raysim.engine.build import build, open_parts
from raysim.engine.loop import run
from raysim.tracking.tracker import MemoryTracker
from raysim.train.local import LocalTrainConfig, train_client
from raysim.types import ClientResult, Payload

FOUR_CLIENTS = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}


@pytest.fixture
def register(monkeypatch):
    """Registers a test plugin for one test only. The registry is the process's: a plugin left in
    it would reach the tests that walk every registered algorithm (a broken one on purpose here)."""

    def add(name, factory):
        monkeypatch.setitem(registry._entries["algorithm"], name, None)  # the key goes at teardown
        registry.register("algorithm", name)(factory)

    return add


def job(name):
    """4 clients of digits; 5 rounds, which a staged plugin may ignore."""
    return tiny_job(
        algorithm={"name": name}, dataset=FOUR_CLIENTS, engine={"num_rounds": 5, "cohort_size": 4}
    )


class AverageOnceConfig(BaseModel, frozen=True, extra="forbid"):
    local: LocalTrainConfig = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1)


class AverageOnce:
    """Every client trains once from the initial model; the global model is their plain mean."""

    Config = AverageOnceConfig

    def __init__(self, config: AverageOnceConfig) -> None:
        self.config = config

    def client_update(self, ctx):
        _, metrics = train_client(ctx, self.config.local)
        return ClientResult(P.clone(P.model_params(ctx.model)), 1.0, metrics)

    def protocol(self, services, state):
        everyone = np.arange(services.info.num_clients)
        out = services.train_cohort(Payload(P.to_numpy(state.params)), everyone, 0)
        positions = [position for position, _ in out.aggregate]  # Gather: no aggregator defined
        models = [result.update for _, result in out.aggregate]
        mean = {k: torch.stack([m[k] for m in models]).mean(dim=0) for k in state.params}
        state = replace(state, params=mean)
        in_order = float(positions == list(range(len(everyone))))
        services.log({"staged/in_order": in_order} | services.evaluate(state, 0), 0)
        return state


class RoundsWithoutTheirMethods(AverageOnce):
    def protocol(self, services, state):
        return services.run_round(state, 0)[0]


class NoClientUpdate:
    Config = AverageOnceConfig

    def __init__(self, config: AverageOnceConfig) -> None:
        self.config = config

    def protocol(self, services, state):
        return state


def test_a_staged_plugin_with_only_client_update_and_protocol_runs_end_to_end_and_is_listed(
    tmp_path, register
):
    register("average_once_test", AverageOnce)
    assert "average_once_test" in registry.names("algorithm")
    result = run(job("average_once_test"), output_dir=tmp_path)
    assert [step for step, _ in result.history] == [0]
    assert result.final["staged/in_order"] == 1.0 and "eval/clients/accuracy" in result.final
    assert result.state.extra is None  # the default fresh state keeps nothing more
    initial = open_parts(job("average_once_test")).params
    moved = [not torch.equal(result.state.params[k], initial[k]) for k in initial]
    assert any(moved)  # the clients trained from the initial model and the mean replaced it
    assert (result.run_dir / "checkpoints" / "final.pt").exists()


def test_a_staged_plugin_without_the_round_loops_methods_cannot_run_a_standard_round(tmp_path, register):
    register("rounds_without_methods_test", RoundsWithoutTheirMethods)
    with pytest.raises(TypeError, match=r"without the round loop's payload and server_update"):
        run(job("rounds_without_methods_test"), output_dir=tmp_path)


def test_a_plugin_without_client_update_is_refused_naming_it_before_any_worker(tmp_path, register):
    register("no_client_update_test", NoClientUpdate)
    with pytest.raises(TypeError, match=r"'no_client_update_test': NoClientUpdate lacks client_update;"):
        build(job("no_client_update_test"), MemoryTracker(), None, tmp_path)
    assert not any(tmp_path.iterdir())  # no run folder, no client state
