"""Naming, freezing and completing the shared and personal parts of a model."""

import torch
from torch import nn

from raysim.models import build_model
from raysim.registry import get
from raysim.train.model_parts import (
    batchnorm_names,
    complete_delta,
    frozen,
    head_names,
    load_part,
    split_parameters,
)
from raysim.types import DataSpec

SPEC = DataSpec("classification", (3, 8, 8), 10)


def resnet(norm="batch"):
    entry = get("model", "resnet10")
    return build_model(entry.name, entry.config.model_validate({"width": 4, "norm": norm}), SPEC)


def test_every_batchnorm_layer_is_found_by_type_shortcuts_included():
    model = resnet()
    names = batchnorm_names(model)
    expected = {
        f"{prefix}.{leaf}"
        for prefix, m in model.named_modules()
        if isinstance(m, nn.BatchNorm2d)
        for leaf in ("weight", "bias", "running_mean", "running_var")
    }
    assert names == expected and any("shortcut" in n for n in names)
    assert not any(n.endswith("num_batches_tracked") for n in names)  # integers do not travel
    assert batchnorm_names(resnet("group")) == frozenset()


def test_the_head_is_named_in_the_models_namespace():
    model = resnet()
    assert head_names(model, "t") == {"head.weight", "head.bias"}
    blocks = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    blocks.features = lambda x: blocks[1](blocks[0](x))  # a head that is a layer of a Sequential
    blocks.head = blocks[2]
    assert head_names(blocks, "t") == {"2.weight", "2.bias"}


def test_frozen_parameters_get_no_gradient_and_their_flags_come_back():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)  # already frozen before: stays frozen after
    head, body = split_parameters(model, model[1])
    with frozen(body):
        model(torch.ones(1, 2)).sum().backward()
        assert model[0].weight.grad is None and model[1].bias.grad is not None
    assert model[0].weight.requires_grad and not model[1].weight.requires_grad
    assert len(head) == 2 and len(body) == 2


def test_load_part_and_complete_delta():
    model = nn.Linear(2, 1)
    load_part(model, {"bias": torch.tensor([3.0])})
    assert model.bias.item() == 3.0
    params = {"weight": torch.ones(1, 2), "bias": torch.ones(1)}
    done = complete_delta({"weight": torch.full((1, 2), 0.5)}, params)
    assert torch.equal(done["bias"], torch.zeros(1)) and torch.equal(done["weight"], torch.full((1, 2), 0.5))
    assert complete_delta(None, params) is None
