"""Renamed plugin options (raysim.config.renames): refused in job files naming the new name, read in
today's names in jobs raysim wrote before."""

import pytest

from raysim.config import JobConfig
from raysim.config.renames import refuse_renamed, upgrade_saved_job
from raysim.errors import ConfigError

SWITCH_AT_3 = {"kind": "switch", "start_round": 3, "after": {"kind": "constant"}}
FEDAVG_V = {"name": "fedavg", "variant": "x"}


FEDGMA_IN_IMA = {"name": "ima", "average_from": 1, "inner": {"name": "fedgma", "variant": "ima_code"}}


@pytest.mark.parametrize(
    ("algorithm", "problem"),
    [
        ({"name": "fedgma", "variant": "ima_code"}, "variant: renamed to algorithm.reading: paper or"),
        ({"name": "fedgma", "tau": 0.8}, "tau: renamed to algorithm.agreement_threshold"),
        ({"name": "fedgucci_plus", "replicate_quirks": True}, "quirks: renamed to algorithm.reading"),
        ({"name": "fedlc", "logit_calibration": {"tau": 0.1}}, "tau: renamed to algorithm.logit_calib"),
        ({"name": "feddyn", "penalty": "norm"}, "penalty: renamed to algorithm.reading: paper (was"),
        ({"name": "local", "init": "client"}, "init: renamed to algorithm.start_from: shared_init"),
        ({"name": "ima", "start_round": 1, "inner": {"name": "fedavg"}}, "round: renamed to algorithm.aver"),
        (FEDGMA_IN_IMA, "algorithm.inner.variant: renamed to algorithm.inner.reading"),
        ({"name": "fedfa", "calibration_start_round": 3}, "start_round: renamed to algorithm.calibrate_from"),
        (
            {"name": "fedprox", "local": {"lr_schedule": SWITCH_AT_3}},
            "algorithm.local.lr_schedule.start_round: renamed to algorithm.local.lr_schedule.from_round",
        ),
        ({"name": "moon", "negative": "initial"}, "negative: value renamed: shared_init (was initial)"),
        ({"name": "fedadam", "server": {"initial_second_moment": "tau_squared"}}, "eps_squared (was tau_"),
        ({"name": "swad", "validation_fraction": 0.1}, "renamed to algorithm.selection_fraction"),
        ({"name": "diwa", "validation_fraction": 0.1}, "renamed to algorithm.selection_fraction"),
        ({"name": "fedfomo", "validation_fraction": 0.1}, "renamed to algorithm.scoring_fraction"),
    ],
)
def test_a_renamed_plugin_option_is_refused_once_naming_its_new_key(algorithm, problem):
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict({"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": algorithm})
    assert len(info.value.problems) == 1, info.value.problems  # not also an "unknown key"
    assert problem in info.value.problems[0] and info.value.problems[0].startswith("algorithm.")


def test_an_option_renamed_in_one_plugin_is_just_unknown_in_another():
    with pytest.raises(ConfigError) as info:  # fedavg never had ``variant``
        JobConfig.from_dict({"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": FEDAVG_V})
    assert len(info.value.problems) == 1 and "algorithm.variant: unknown key" in info.value.problems[0]


# Every old name, in a job as raysim wrote it before the renames (resolved: every option present).
SAVED_BEFORE_RENAMES = [
    ({"name": "fedgma", "variant": "ima_code", "tau": 0.5},
     {"reading": "ima_code", "agreement_threshold": 0.5}),
    ({"name": "fedgucci_plus", "replicate_quirks": True, "logit_calibration": {"tau": 0.1}},
     {"reading": "fedgucci_code", "logit_calibration": {"strength": 0.1}}),
    ({"name": "feddyn", "penalty": "norm"}, {"reading": "fedgucci_code"}),
    ({"name": "local", "init": "client"}, {"start_from": "client_init"}),
    ({"name": "moon", "negative": "initial"}, {"negative": "shared_init"}),
    ({"name": "fedadam", "server": {"kind": "adam", "initial_second_moment": "tau_squared"}},
     {"server": {"kind": "adam", "initial_second_moment": "eps_squared"}}),
    ({"name": "ima", "start_round": 2, "inner": {"name": "feddyn", "penalty": "squared"}},
     {"average_from": 2, "inner": {"name": "feddyn", "reading": "paper"}}),
    ({"name": "fedfa", "anchor_loss_start_round": 1, "local": {"epochs_schedule": {"start_round": 4}}},
     {"anchor_loss_from": 1, "local": {"epochs_schedule": {"from_round": 4}}}),
    ({"name": "soups", "validation_fraction": 0.3}, {"selection_fraction": 0.3}),
    ({"name": "fedfomo", "validation_fraction": 0.3}, {"scoring_fraction": 0.3}),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), SAVED_BEFORE_RENAMES)
def test_a_job_saved_before_the_renames_is_upgraded_to_todays_names(old, new):
    """A checkpoint's or a logged run's job is raysim's own writing: it is read in today's names
    (resume then sees no change the user did not make), where a job file is refused."""
    job = {"name": "j", "dataset": {"name": "digits"}, "algorithm": old}
    upgraded = upgrade_saved_job(job)
    assert upgraded["algorithm"] == {"name": old["name"], **new}
    assert upgraded["dataset"] == job["dataset"] and job["algorithm"] == old  # the input is not changed
    assert upgrade_saved_job(upgraded) == upgraded  # today's names stay as they are
    problems: list[str] = []
    refuse_renamed(upgraded["algorithm"], "algorithm", problems)
    assert problems == []
