"""A job with ``privacy.sample`` is refused before training where DP-SGD cannot hold: a plugin that
trains outside the law (also inside a wrapper), ``engine.vectorize: on``, a model with BatchNorm."""

from torch import nn

from raysim import registry
from raysim.config import JobConfig
from raysim.privacy.sample_level import REFUSED, sample_privacy_problems

SAMPLE = {"sample": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}


def job(algorithm: dict, privacy: dict | None = SAMPLE, **sections) -> JobConfig:
    raw = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": algorithm, **sections}
    return JobConfig.from_dict(raw | ({"privacy": privacy} if privacy is not None else {}))


def test_a_plugin_that_trains_through_the_shared_trainer_passes():
    for name in ("fedavg", "fedprox", "scaffold", "feddyn", "fednova", "swa"):
        assert sample_privacy_problems(job({"name": name})) == [], name
    assert sample_privacy_problems(job({"name": "fedsam"}, privacy=None)) == []  # no privacy.sample


def test_a_plugin_that_cannot_honour_it_is_refused_naming_it_and_the_fix():
    [problem] = sample_privacy_problems(job({"name": "fedsam"}))
    assert "'fedsam'" in problem and "SAM takes two gradients" in problem and "fedavg, fedprox" in problem
    assert "drop privacy.sample" in problem


def test_every_refused_name_is_a_registered_algorithm():
    assert set(REFUSED) <= set(registry.names("algorithm"))


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
