"""The ``model_groups`` section: which client trains which architecture (a pure function of the
rule, the population and the seed), and the jobs refused before any training."""

import numpy as np
import pytest

from raysim.config import JobConfig
from raysim.errors import ConfigError

R10 = {"name": "resnet10", "width": 4}
R18 = {"name": "resnet18", "width": 4}
R26 = {"name": "resnet26", "width": 4}


def job(algorithm="fusefl", **groups):
    raw = {"dataset": {"name": "mnist"}, "algorithm": {"name": algorithm}, "model_groups": groups}
    return JobConfig.from_dict(raw)


def problems(algorithm="fusefl", **groups):
    with pytest.raises(ConfigError) as error:
        job(algorithm, **groups)
    return error.value.problems


def test_round_robin_gives_client_c_the_group_c_mod_g():
    groups = job(models=[R10, R18, R26]).model_groups
    np.testing.assert_array_equal(groups.group_of(7, seed=0), [0, 1, 2, 0, 1, 2, 0])
    names = [section["name"] for section in groups.client_models(4, seed=5)]
    assert names == ["resnet10", "resnet18", "resnet26", "resnet10"]


def test_fractions_give_each_group_its_share_by_largest_remainder_placed_by_the_seed():
    """N = 5 at (0.4, 0.2, 0.4): 2, 1, 2 clients exactly; N = 7: shares 2.8, 1.4, 2.8 floor to
    2, 1, 2 and the two largest remainders (0.8, 0.8; ties to the lower group) get the rest."""
    groups = job(models=[R10, R18, R26], assign="fractions", fractions=[0.4, 0.2, 0.4]).model_groups
    assert np.bincount(groups.group_of(5, seed=0)).tolist() == [2, 1, 2]
    assert np.bincount(groups.group_of(7, seed=0)).tolist() == [3, 1, 3]
    np.testing.assert_array_equal(groups.group_of(20, seed=3), groups.group_of(20, seed=3))
    assert any(not np.array_equal(groups.group_of(20, 0), groups.group_of(20, s)) for s in (1, 2, 3))
    blocks = job(models=[R10, R18, R26], assign="fractions", fractions=[0.4, 0.2, 0.4], shuffle=False)
    np.testing.assert_array_equal(blocks.model_groups.group_of(5, seed=9), [0, 0, 1, 2, 2])
    assert blocks.model_groups.empty_groups(2, seed=0) == [
        "model_groups.models[1]: 2 clients leave this group empty; give it a larger fraction or drop it"
    ]


def test_the_job_model_defaults_to_the_first_group_and_the_section_round_trips():
    config = job(models=[R10, R18])
    assert config.model.name == "resnet10" and config.model.config.width == 4
    resolved = config.to_dict()
    assert [m["name"] for m in resolved["model_groups"]["models"]] == ["resnet10", "resnet18"]
    assert JobConfig.from_dict(resolved) == config
    plain = JobConfig.from_dict({"dataset": {"name": "mnist"}, "model": R10, "algorithm": {"name": "fedavg"}})
    assert "model_groups" not in plain.to_dict()  # a job without groups resolves as before


def test_an_algorithm_that_averages_parameters_refuses_mixed_architectures():
    [problem] = problems("fedavg", models=[R10, R18])
    assert problem.startswith("model_groups: algorithm 'fedavg' needs one architecture")
    assert "drop model_groups" in problem and "fusefl" in problem
    assert problems("oneshot_fedavg", models=[R10, R18])[0].startswith(
        "model_groups: algorithm 'oneshot_fedavg'"
    )
    assert job("fedavg", models=[R10, dict(R10)]).model_groups.is_mixed is False  # one architecture twice


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ({"models": [R10, R18], "assign": "fractions"}, "fractions needs fractions"),
        (
            {"models": [R10, R18], "assign": "fractions", "fractions": [0.7, 0.7]},
            "must be positive and sum to 1",
        ),
        ({"models": [R10, R18], "assign": "fractions", "fractions": [1.0]}, "1 shares for 2 models"),
        ({"models": [R10, R18], "fractions": [0.5, 0.5]}, "read only with assign: fractions"),
        ({"models": [R10, {"name": "resnet18", "widht": 4}]}, "model_groups.models[1].widht: unknown key"),
        ({"models": []}, "model_groups.models: required"),
    ],
)
def test_a_bad_section_is_one_error_naming_the_key(groups, expected):
    found = problems(**groups)
    assert len(found) == 1 and expected in found[0] and found[0].startswith("model_groups")


def test_the_job_model_must_be_one_of_the_groups():
    raw = {
        "dataset": {"name": "mnist"},
        "model": R26,
        "algorithm": {"name": "fedavg"},
        "model_groups": {"models": [R10]},
    }
    with pytest.raises(ConfigError) as error:
        JobConfig.from_dict(raw)
    [problem] = error.value.problems
    assert problem.startswith("model: with model_groups it must be one of the groups' models")
