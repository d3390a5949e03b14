"""A job with ``privacy.sample`` is refused before training where DP-SGD cannot hold: a plugin whose
Config says why (``sample_privacy_problem``, also inside a wrapper), ``engine.vectorize: on``, a
model with BatchNorm. No table of plugin names decides it: a plugin without the hook passes."""

import inspect

import pytest
from pydantic import BaseModel
from torch import nn

import raysim.privacy.sample_level
from raysim import registry
from raysim.config import JobConfig
from raysim.config.plugins import sample_privacy_problem
from raysim.privacy.sample_level import sample_privacy_problems

SAMPLE = {"sample": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}
# the plugins that cannot honour DP-SGD (docs/privacy.md), and a phrase of each one's reason
REFUSING = {
    "fedsam": "SAM takes two gradients",
    "fedasam": "SAM takes two gradients",
    "fedgucci": "once per anchor on every batch, and",
    "fedgucci_plus": "once per anchor on every batch, with SAM",
    "moon": "contrastive term",
    "fedlc": "label counts",
    "fedrod": "balanced loss",
    "fedfa": "class-mean features",
    "fedfomo": "scores its peers",
    "fedrep": "trains twice a round",
    "lss": "its regulariser",
    "soups": "several ingredients",
    "diwa": "several ingredients",
    "swad": "averaging window",
    "fusefl": "feature statistics",
    "oneshot_fedavg": "one-shot cache",
    "ensemble": "one-shot cache",
    "feddf": "one-shot cache",
    "dense": "one-shot cache",
}


def job(algorithm: dict, privacy: dict | None = SAMPLE, **sections) -> JobConfig:
    raw = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": algorithm, **sections}
    return JobConfig.from_dict(raw | ({"privacy": privacy} if privacy is not None else {}))


class NoHook(BaseModel, frozen=True):
    """A plugin Config that says nothing about DP-SGD, as a new plugin's would."""

    lr: float = 0.1


def test_a_plugin_without_the_hook_passes():
    assert sample_privacy_problem(NoHook()) is None
    for name in ("fedavg", "fedprox", "scaffold", "feddyn", "fednova", "swa"):
        assert not hasattr(registry.get("algorithm", name).config, "sample_privacy_problem"), name
        assert sample_privacy_problems(job({"name": name})) == [], name
    assert sample_privacy_problems(job({"name": "fedsam"}, privacy=None)) == []  # no privacy.sample


@pytest.mark.parametrize("name", sorted(REFUSING))
def test_each_refusing_plugin_is_refused_naming_it_its_reason_and_the_fix(name):
    [problem] = sample_privacy_problems(job({"name": name}))
    assert f"algorithm {name!r} cannot honour DP-SGD" in problem and REFUSING[name] in problem
    assert "fedavg, fedprox" in problem and "drop privacy.sample" in problem


def test_no_table_of_plugin_names_decides_it():
    source = inspect.getsource(raysim.privacy.sample_level)
    named = [name for name in registry.names("algorithm") if f'"{name}"' in source or f"'{name}'" in source]
    assert named == []
    assert len(REFUSING) == 19 and set(REFUSING) <= set(registry.names("algorithm"))


def test_a_wrapped_plugin_is_followed_and_fedfish_depends_on_its_fisher():
    [problem] = sample_privacy_problems(job({"name": "ima", "average_from": 5, "inner": {"name": "moon"}}))
    assert "'moon'" in problem
    assert sample_privacy_problems(job({"name": "ima", "average_from": 5, "inner": {"name": "fedavg"}})) == []
    [fisher] = sample_privacy_problems(job({"name": "fedfish"}))  # extra_pass, the default
    assert "fisher_source: last_epoch" in fisher
    assert sample_privacy_problems(job({"name": "fedfish", "fisher_source": "last_epoch"})) == []


def test_vectorize_on_and_a_batchnorm_model_are_refused():
    [vectorize] = sample_privacy_problems(job({"name": "fedavg"}, engine={"vectorize": "on"}))
    assert "engine.vectorize: on" in vectorize and "auto" in vectorize
    assert sample_privacy_problems(job({"name": "fedavg"}, engine={"vectorize": "auto"})) == []
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    [batchnorm] = sample_privacy_problems(job({"name": "fedavg"}), model)
    assert "'1' (BatchNorm1d)" in batchnorm
    assert (
        sample_privacy_problems(job({"name": "fedavg"}), nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
        == []
    )
