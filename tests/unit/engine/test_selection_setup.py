"""``engine.selection`` made into the run's selector (raysim/engine/selection_setup.py): refused for
a plugin with its own protocol, drawing the simulated clock's cohorts, saved and restored whole."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from raysim.config import JobConfig, deep_merge
from raysim.engine.selection_setup import open_selection, restore_selection, saved_selection
from raysim.errors import CheckpointError, ConfigError
from raysim.runtime.builders import build_algorithm
from raysim.selection.oort import Oort
from raysim.selection.power_of_choice import PowerOfChoice
from raysim.selection.selector import Feedback

STORE = SimpleNamespace(num_examples=lambda split: np.full(20, 50))


def job(selection, algorithm="fedavg") -> JobConfig:
    base = {
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 20}},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": algorithm} | ({"weighted": False} if algorithm == "fedavg" else {}),
        "engine": {"num_rounds": 4, "cohort_size": 5, "selection": selection},
    }
    return JobConfig.from_dict(deep_merge(base, {}))


def test_uniform_makes_no_selector():
    config = job({"kind": "uniform"})
    assert open_selection(config, STORE, build_algorithm(config), None, None) is None


def test_a_plugin_running_its_own_protocol_is_refused():
    config = job({"kind": "oort"}, algorithm="oneshot_fedavg")
    with pytest.raises(ConfigError, match="runs its own protocol; use engine.selection: {kind: uniform}"):
        open_selection(config, STORE, build_algorithm(config), None, None)


def test_the_state_and_the_clock_come_back_from_a_checkpoint():
    config = job({"kind": "power_of_choice"})
    clock = SimpleNamespace(ends=[3.0, 7.5], resume=lambda ends: setattr(clock, "resumed", ends))
    selector = PowerOfChoice(None, np.full(20, 50.0))
    selector.observe(0, [Feedback(4, 50, 1.25)])
    saved = saved_selection(selector, clock)
    checkpoint = SimpleNamespace(selection=saved, path=Path("final.pt"))
    clock.fleet = SimpleNamespace(num_examples=np.full(20, 50), examples_per_s=np.ones(20))
    again = open_selection(config, STORE, build_algorithm(config), clock, checkpoint)
    assert again.loss == {4: 1.25} and clock.resumed == [3.0, 7.5] and clock.selector is again


@pytest.mark.parametrize("saved", [None, {"kind": "Oort", "selector": {}, "clock": [1.0]}])
def test_a_checkpoint_without_this_selections_state_is_refused(saved):
    with pytest.raises(CheckpointError, match="holds no engine.selection state"):
        restore_selection(PowerOfChoice(None, np.ones(3)), None, saved, "final.pt")


def test_oort_on_the_clock_is_given_the_fleets_speeds():
    config = job({"kind": "oort"})
    clock = SimpleNamespace(
        fleet=SimpleNamespace(num_examples=np.full(20, 50), examples_per_s=np.arange(20.0))
    )
    selector = open_selection(config, STORE, build_algorithm(config), clock, None)
    assert isinstance(selector, Oort) and list(selector.speeds) == list(range(20))
