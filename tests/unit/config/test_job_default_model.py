"""A job that names no model: the algorithm plugin's ``DEFAULT_MODEL`` (DENSE's BatchNorm ResNet),
else the dataset recipe's (digits' MLP); a job's own ``model`` always wins. Every registered
algorithm validates from a two-line job on digits (config and model checks only, no training)."""

import pytest
from torch import nn

from raysim import registry
from raysim.config import JobConfig
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.types import DataSpec

DIGITS = DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10)
# Algorithms whose Config cannot validate without options: their shortest job is longer.
NEEDS_OPTIONS = {"ima": ("algorithm.inner", "algorithm.average_from")}


def two_line_job(algorithm: str, **extra: dict) -> JobConfig:
    return JobConfig.from_dict({"dataset": {"name": "digits"}, "algorithm": {"name": algorithm}, **extra})


def model_problems(job: JobConfig) -> list[str]:
    """What the algorithm's ``check_model`` says of the job's model built for the digits."""
    check = getattr(job.algorithm.config, "check_model", None)
    return check(build_model(job.model.name, job.model.config, DIGITS)) if callable(check) else []


def test_the_two_line_dense_job_resolves_to_a_batchnorm_model_dense_accepts():
    job = two_line_job("dense")
    assert job.model.to_dict()["name"] == "resnet10" and job.model.to_dict()["norm"] == "batch"
    assert job.to_dict()["model"]["width"] == 16  # written out: the resolved config reruns the same job
    model = build_model(job.model.name, job.model.config, DIGITS)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert model_problems(job) == []


def test_a_named_model_wins_and_dense_still_refuses_one_without_batchnorm():
    job = two_line_job("dense", model={"name": "mlp"})
    assert job.model.name == "mlp"
    (problem,) = model_problems(job)
    assert problem.startswith("algorithm.synthesis.bn: the model has no BatchNorm2d layer")


def test_without_an_algorithm_default_the_dataset_default_applies_and_a_named_model_wins():
    assert two_line_job("fedavg").model.to_dict() == {"name": "mlp", "init_from": None, "hidden": [64]}
    assert two_line_job("fedavg", model={"name": "cnn_mnist"}).model.name == "cnn_mnist"


def test_a_job_without_model_whose_plugins_name_none_is_still_refused():
    with pytest.raises(ConfigError, match="model: required section missing"):
        JobConfig.from_dict({"dataset": {"name": "mnist"}, "algorithm": {"name": "fedavg"}})


@pytest.mark.parametrize("name", registry.names("algorithm"))
def test_every_algorithm_validates_from_a_two_line_job_on_digits(name):
    if name in NEEDS_OPTIONS:
        with pytest.raises(ConfigError) as refused:
            two_line_job(name)
        assert all(key in str(refused.value) for key in NEEDS_OPTIONS[name])
        return
    assert model_problems(two_line_job(name)) == []
