"""MACs per example and parameter counts against counts by hand."""

import pytest
import torch
from torch import nn

from raysim.measure.macs import forward_macs, model_cost, num_parameters


def test_a_linear_layer_costs_its_weight_count_per_example():
    layer = nn.Linear(10, 3)
    assert forward_macs(layer, torch.randn(4, 10)) == 10 * 3  # the bias adds, it multiplies nothing
    assert num_parameters(layer) == 10 * 3 + 3


def test_a_small_cnn_against_a_hand_count():
    """conv 1->2 channels, 3x3, on 5x5: 2 x 3 x 3 outputs of 1 x 3 x 3 MACs each; then 18 -> 4."""
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(18, 4))
    cost = model_cost(model, torch.randn(2, 1, 5, 5))
    assert cost.macs_per_example == (2 * 3 * 3) * (1 * 3 * 3) + 18 * 4
    assert cost.params == (2 * 9 + 2) + (18 * 4 + 4)


def test_counting_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    forward_macs(model, torch.randn(3, 4))
    assert model.training  # back in training mode
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics too


def test_resnet18_at_32x32_costs_the_published_figures():
    """ResNet-18 on 32x32 images (the FuseFL paper's model) is 0.555 GMAC and 11,173,962
    parameters (10 classes)."""
    from raysim.models import build_model
    from raysim.types import DataSpec

    model = build_model("resnet18", {}, DataSpec("classification", (3, 32, 32), 10))
    cost = model_cost(model, torch.zeros(1, 3, 32, 32))
    assert cost.params == 11_173_962
    assert cost.macs_per_example / 1e9 == pytest.approx(0.555, abs=0.0005)
