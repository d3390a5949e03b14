"""The plugins' checks on the model and the data (raysim/types.py): ``feature_model`` and
``require_classification``, with the messages that name the fix; a ``ClientContext`` is frozen."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from raysim.errors import ConfigError
from raysim.models.anatomy import FeatureModel as AnatomyFeatureModel
from raysim.types import (
    ClientContext,
    ClientData,
    DataSpec,
    FeatureModel,
    Payload,
    RunInfo,
    feature_model,
    require_classification,
)


class Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_feature_model_is_the_model_itself_when_it_has_features_and_head():
    model = Split()
    net = feature_model(model, "moon")
    assert net is model and isinstance(net, FeatureModel)
    x = torch.ones(1, 3)
    assert torch.equal(net.head(net.features(x)), model(x))


@pytest.mark.parametrize("model", [nn.Linear(3, 2), nn.Sequential(nn.Linear(3, 2))])
def test_a_model_without_features_or_head_is_refused_naming_the_plugin_and_the_fix(model):
    with pytest.raises(TypeError, match=r"fedrod needs a model with features\(x\) and head") as info:
        feature_model(model, "fedrod")
    assert type(model).__name__ in str(info.value) and "define both" in str(info.value)


def test_a_model_with_features_but_no_head_is_refused():
    class NoHead(nn.Module):
        def features(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError, match="NoHead"):
        feature_model(NoHead(), "fedfa")


def test_the_anatomy_module_re_exports_the_protocol():
    assert AnatomyFeatureModel is FeatureModel


SPEC = DataSpec("regression", (2,), 1)


@pytest.mark.parametrize(
    "where",
    [SPEC, RunInfo(num_clients=2, cohort_size=1, num_rounds=1, spec=SPEC, seed=0)],
    ids=["spec", "info"],
)
def test_require_classification_refuses_other_tasks_with_who_and_why(where):
    with pytest.raises(ConfigError) as info:
        require_classification(where, "algorithm fedlc", "it calibrates class logits")
    assert info.value.problems == [
        "algorithm fedlc needs a classification task, not the dataset's 'regression': "
        "it calibrates class logits"
    ]


def test_require_classification_accepts_classification():
    require_classification(DataSpec("classification", (2,), 3), "algorithm moon", "cross-entropy")


def test_a_client_context_is_frozen_and_replace_derives_another():
    spec = DataSpec(task="classification", input_shape=(3,), num_classes=2)
    data = ClientData({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int64)})
    ctx: ClientContext[None, None] = ClientContext(
        0, 0, Split(), Payload({}), {}, data, None, 7, torch.device("cpu"), spec
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.step_budget = 3  # type: ignore[misc]  # what a plugin must not do
    capped = dataclasses.replace(ctx, step_budget=3)
    assert (capped.step_budget, ctx.step_budget, capped.seed) == (3, None, 7)
