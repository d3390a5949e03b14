"""The job's privacy: section (raysim/config/privacy.py): every value that cannot give a guarantee
is refused when the job is read, with the key and the fix."""

import re

import pytest

from raysim.config import JobConfig, deep_merge
from raysim.errors import ConfigError

BASE = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}


def refused(privacy) -> str:
    with pytest.raises(ConfigError) as caught:
        JobConfig.from_dict(deep_merge(BASE, {"privacy": privacy}))
    return str(caught.value)


@pytest.mark.parametrize(
    "central, says",
    [
        (
            {"clip_bound": -1.0, "noise_multiplier": 1.0},
            "privacy.central.clip_bound: Input should be greater than 0",
        ),
        (
            {"clip_bound": float("nan"), "noise_multiplier": 1.0},
            "privacy.central.clip_bound: Input should be a finite",
        ),
        (
            {"clip_bound": 1.0, "noise_multiplier": -0.5},
            "privacy.central.noise_multiplier: Input should be greater",
        ),
        (
            {"clip_bound": 1.0, "noise_multiplier": float("inf")},
            "privacy.central.noise_multiplier: Input should be a finite",
        ),
        ({"clip_bound": 1.0}, "set exactly one of noise_multiplier"),
        (
            {"clip_bound": 1.0, "noise_multiplier": 1.0, "target_epsilon": 2.0},
            "set exactly one of noise_multiplier",
        ),
        (
            {"clip_bound": 1.0, "noise_multiplier": 1.0, "weight_cap": 0},
            "weight_cap: Input should be greater",
        ),
        ({"clip_bound": 1.0, "noise_multiplier": 1.0, "bands": 2, "adaptive": {}}, "set bands: 1"),
    ],
)
def test_a_central_section_that_gives_no_guarantee_is_refused(central, says):
    assert says in refused({"central": central, "delta": 1e-5})


def test_delta_budget_and_mechanisms_are_checked_together():
    assert "delta: required by a Gaussian mechanism" in refused(
        {"central": {"clip_bound": 1.0, "noise_multiplier": 1.0}}
    )
    assert "names no mechanism" in refused({"delta": 1e-5})
    assert "privacy.delta: Input should be less than 1" in refused(
        {"central": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1.5}
    )
    over = {"central": {"clip_bound": 1.0, "target_epsilon": 9.0}, "delta": 1e-5, "budget": {"epsilon": 8.0}}
    assert "exceeds budget.epsilon 8" in refused(over)
    laplace = {"local": {"mechanism": "laplace", "clip_bound": 1.0, "noise_multiplier": 1.0}}
    assert (
        JobConfig.from_dict(deep_merge(BASE, {"privacy": laplace})).privacy is not None
    )  # pure DP: no delta


def test_a_job_without_privacy_reads_as_before():
    job = JobConfig.from_dict(BASE)
    assert job.privacy is None and "privacy" not in job.to_dict() and job.engine.sampling == "fixed"


def job_with(**sections) -> JobConfig:
    private = {"privacy": {"central": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}}
    return JobConfig.from_dict(deep_merge(deep_merge(BASE, private), sections))


@pytest.mark.parametrize(
    "sections, says",
    [
        ({"engine": {"schedule": "cohorts.json"}}, "privacy.central: engine.schedule picks the cohorts"),
        ({"engine": {"sampling": "poisson", "schedule": "c.json"}}, "engine.sampling: poisson draws each"),
        ({"privacy": {"central": {"bands": 4}}}, "privacy.central.bands: DP-FTRL's noise is accounted"),
        ({"privacy": {"accountant": "pld"}}, "privacy.accountant: the pld accountant cannot account fixed"),
        ({"privacy": {"accountant": "prv"}}, "use accountant: rdp, or engine.sampling: poisson"),
    ],
)
def test_sampling_the_accountant_cannot_trust_is_refused_when_the_job_is_read(sections, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        job_with(**sections)


def test_poisson_sampling_with_pld_or_banded_noise_is_read():
    poisson = {"engine": {"sampling": "poisson"}}
    assert job_with(**poisson, privacy={"accountant": "pld", "central": {"bands": 4}}).privacy is not None
