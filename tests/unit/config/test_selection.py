"""``engine.selection`` (raysim.config.selection): its options, and the jobs it is refused in, each
in one line before anything is built."""

import pytest
from raw_jobs import BASE, problems_of

from raysim.config import JobConfig, deep_merge

CENTRAL = {"privacy": {"central": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}}


def job(selection, **sections):
    return deep_merge(deep_merge(BASE, {"engine": {"selection": selection, "cohort_size": 4}}), sections)


def test_unset_is_uniform_and_leaves_the_config_as_before():
    plain = JobConfig.from_dict(BASE)
    assert plain.engine.selection is None and "selection" not in plain.to_dict()["engine"]
    oort = JobConfig.from_dict(job({"kind": "oort", "epsilon": 0.5}))
    assert oort.to_dict()["engine"]["selection"]["epsilon"] == 0.5
    assert JobConfig.from_dict(oort.to_dict()) == oort


@pytest.mark.parametrize(
    ("selection", "sections", "problem"),
    [
        (
            {"kind": "oort"},
            CENTRAL,
            "engine.selection: oort picks clients by their losses, and privacy.central",
        ),
        ({"kind": "power_of_choice"}, {"engine": {"sampling": "poisson"}}, "set engine.sampling: fixed"),
        ({"kind": "oort"}, {"engine": {"schedule": "cohorts.json"}}, "engine.schedule fixes them; unset one"),
        ({"kind": "power_of_choice", "d": 3}, {}, "d 3 is below engine.cohort_size 4; raise d"),
        (
            {"kind": "power_of_choice"},
            {},
            "weights their updates by examples again (Cho et al. average them uniformly); "
            "set algorithm.weighted: false",
        ),
        (
            {"kind": "power_of_choice"},
            {"algorithm": {"name": "scaffold", "weighted": True}},
            "algorithm 'scaffold' weights their updates by examples again",
        ),
        ({"kind": "oort", "epsilon": 1.5}, {}, "engine.selection.oort.epsilon: Input should be less than"),
        ({"kind": "oort", "alpha": -1}, {}, "engine.selection.oort.alpha: Input should be greater than"),
        ({"kind": "oort", "epsilon": 0.1}, {}, "epsilon_min 0.2 is above epsilon 0.1; lower it"),
        ({"kind": "greedy"}, {}, "engine.selection"),
    ],
)
def test_refused(selection, sections, problem):
    problems = problems_of(job(selection, **sections))
    assert any(problem in p for p in problems), problems


def test_uniform_goes_with_central_privacy():
    raw = job({"kind": "uniform"}, **CENTRAL)
    assert JobConfig.from_dict(raw).engine.selection.kind == "uniform"


@pytest.mark.parametrize("algorithm", [{"name": "fedavg", "weighted": False}, {"name": "scaffold"}])
def test_power_of_choice_goes_with_a_uniform_mean_of_the_selected_updates(algorithm):
    raw = job({"kind": "power_of_choice"}, algorithm=algorithm)
    assert JobConfig.from_dict(raw).engine.selection.kind == "power_of_choice"
