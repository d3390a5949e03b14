"""A plugin defined in a notebook cell (module ``__main__``) runs on Ray workers: its class travels
in the workers' start-up arguments (``registry.travelling_entries``), where it used to be looked up
by name and fail ("unknown algorithm") after a minute of Ray tracebacks."""

import numpy as np
import pytest

from jobs import tiny_job
from raysim import registry
from raysim.engine.loop import run

NOTEBOOK_CELL = '''
from pydantic import BaseModel

import raysim
from raysim.train.local import examples_trained_on
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload


class DampedConfig(BaseModel, frozen=True, extra="forbid"):
    """FedAvg whose server moves lr of the way to the clients' mean."""

    lr: float = 0.5
    local: raysim.LocalTrainConfig = raysim.LocalTrainConfig()


@raysim.register("algorithm", "damped_main_test")
class Damped:
    Config = DampedConfig

    def __init__(self, config):
        self.config = config

    def init(self, params, info):
        return init_state(params, info, None)

    def payload(self, state, round_num, info):
        return params_payload(state)

    def client_update(self, ctx):
        delta, metrics = raysim.train_client(ctx, self.config.local)
        return raysim.ClientResult(delta, examples_trained_on(metrics), metrics)

    def aggregator(self):
        return raysim.WeightedMean()

    def server_update(self, state, mean_delta, round_num, info):
        return apply_server_step(state, mean_delta, ServerOptimizerConfig(lr=self.config.lr))
'''


@pytest.fixture
def main_plugin():
    cell = {"__name__": "__main__"}  # as a notebook's (or a script's) own code is
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), cell)
    assert cell["Damped"].__module__ == "__main__"
    yield
    del registry._entries["algorithm"]["damped_main_test"]


def test_a_plugin_of_main_trains_on_ray_workers_as_in_process(main_plugin, ray_local, tmp_path):
    named = [("algorithm", "damped_main_test"), ("algorithm", "fedavg"), ("model", "mlp")]
    assert [e.name for e in registry.travelling_entries(named)] == ["damped_main_test"]  # built-ins stay
    algorithm = {"name": "damped_main_test", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}}
    finals = []
    for backend in ("serial", "ray"):
        job = tiny_job(
            algorithm=algorithm, engine={"num_rounds": 1}, resources={"backend": backend, "num_workers": 2}
        )
        result = run(job, output_dir=tmp_path / backend)
        finals.append(result.state.params)
    serial, ray = finals
    assert all(np.array_equal(serial[k].numpy(), ray[k].numpy()) for k in serial)  # same model either way
