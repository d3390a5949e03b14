"""Tests of the MLP and CNNs in raysim/models/vision.py, and of build_model.

Parameter counts are derived by hand, as (weights + biases) per layer:

- mlp, 1x28x28, hidden (200, 200), 10 classes: 784*200+200 + 200*200+200 + 200*10+10 = 199,210.
- cnn_mnist, 1x28x28: conv 1*32*25+32 = 832; conv 32*64*25+64 = 51,264; FC 3136*512+512 =
  1,606,144; FC 512*10+10 = 5,130; total 1,663,370 (the FedAvg paper's CNN).
- cnn_mnist, 1x8x8: same convs (52,096); 8 -> pool 4 -> pool 2, so FC 256*512+512 = 131,584;
  5,130; total 188,810.
- cnn_fmnist, 1x28x28: 28 -conv5-> 24 -pool-> 12 -conv5-> 8 -pool-> 4, flatten 32*16 = 512.
  832 + 32*32*25+32 = 25,632 + 512*384+384 = 196,992 + 384*128+128 = 49,280 + 1,290 = 274,026.
- cnn_cifar, 3x32x32: 32 -> 28 -> 14 -> 10 -> 5, flatten 64*25 = 1600. 3*64*25+64 = 4,864 +
  64*64*25+64 = 102,464 + 1600*384+384 = 614,784 + 49,280 + 1,290 = 772,682 (IMA: ~0.77M).
- cnn_pfl, 3x32x32: 896 + 18,496 + 12544*128+128 = 1,605,760 + 1,290 = 1,626,442 (pfl-research).
- cnn_pfl, 1x28x28, 62 classes (FedFish EMNIST): 320 + 18,496 + 9216*128+128 = 1,179,776 +
  128*62+62 = 7,998; total 1,206,590.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel
from torch import nn

from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.vision import MLPConfig
from raysim.types import DataSpec


def image_spec(shape: tuple[int, ...], num_classes: int = 10) -> DataSpec:
    return DataSpec("classification", shape, num_classes)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "shape", "num_classes", "expected"),
    [
        ("mlp", (1, 28, 28), 10, 199_210),
        ("cnn_mnist", (1, 28, 28), 10, 1_663_370),
        ("cnn_mnist", (1, 8, 8), 10, 188_810),
        ("cnn_fmnist", (1, 28, 28), 10, 274_026),
        ("cnn_cifar", (3, 32, 32), 10, 772_682),
        ("cnn_pfl", (3, 32, 32), 10, 1_626_442),
        ("cnn_pfl", (1, 28, 28), 62, 1_206_590),
    ],
)
def test_parameter_count_and_output_shape(name, shape, num_classes, expected):
    model = build_model(name, {}, image_spec(shape, num_classes))
    logits = model(torch.randn(3, *shape))
    assert num_params(model) == expected
    assert logits.shape == (3, num_classes)
    assert logits.dtype == torch.float32


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (1, 8, 8)])
def test_cnn_mnist_accepts_common_image_sizes(shape):
    model = build_model("cnn_mnist", {}, image_spec(shape))
    assert model(torch.randn(2, *shape)).shape == (2, 10)


def test_mlp_works_for_any_input_shape_and_without_hidden_layers():
    model = build_model("mlp", {"hidden": []}, image_spec((5, 7), 3))
    assert model(torch.randn(4, 5, 7)).shape == (4, 3)
    assert num_params(model) == 35 * 3 + 3  # logistic regression


@pytest.mark.parametrize("name", ["mlp", "cnn_mnist", "cnn_fmnist", "cnn_cifar", "cnn_pfl"])
def test_construction_is_deterministic_under_a_seed(name):
    spec = image_spec((3, 32, 32))

    def build(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, {}, spec).state_dict()

    first, again, other = build(0), build(0), build(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize("name", ["cnn_mnist", "cnn_fmnist", "cnn_cifar", "cnn_pfl"])
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (DataSpec("classification", (784,), 10), "input_shape"),
        (DataSpec("classification", (28, 28), 10), r"\(1, H, W\)"),
        (DataSpec("causal_lm", (1, 28, 28), 10), "causal_lm"),
    ],
)
def test_cnns_reject_specs_they_cannot_handle(name, spec, message):
    with pytest.raises(ValueError, match=message):
        build_model(name, {}, spec)


def test_too_small_image_raises_a_value_error():
    with pytest.raises(ValueError, match="too small"):
        build_model("cnn_fmnist", {}, image_spec((1, 8, 8)))


def test_mlp_rejects_causal_lm():
    with pytest.raises(ValueError, match="classifier"):
        build_model("mlp", {}, DataSpec("causal_lm", (16,), 100))


def test_cnn_pfl_uses_pfl_dropout_rates_and_glorot_init():
    model = build_model("cnn_pfl", {}, image_spec((3, 32, 32)))
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    dense = model[7]  # Linear(12544, 128)
    # Glorot uniform: bound sqrt(6 / (fan_in + fan_out)); torch's default bound is 1/sqrt(fan_in).
    bound = (6 / (12_544 + 128)) ** 0.5
    assert rates == [0.25, 0.5]
    assert dense.weight.abs().max() <= bound
    assert dense.weight.abs().max() > 0.99 * bound


def test_build_model_validates_options_and_reports_dotted_keys():
    spec = image_spec((1, 28, 28))
    with pytest.raises(ConfigError) as caught:
        build_model("mlp", {"hidden": [0], "depth": 3}, spec)
    problems = caught.value.problems
    assert any(p.startswith("model.hidden.0:") for p in problems)
    assert any(p.startswith("model.depth:") for p in problems)


def test_build_model_accepts_a_config_and_ignores_a_name_key():
    spec = image_spec((1, 28, 28))
    from_config = build_model("mlp", MLPConfig(hidden=(7,)), spec)
    from_section = build_model("mlp", {"name": "mlp", "hidden": [7]}, spec)
    assert num_params(from_config) == num_params(from_section) == 784 * 7 + 7 + 7 * 10 + 10


def test_build_model_rejects_another_models_config():
    class Other(BaseModel):
        pass

    with pytest.raises(TypeError, match="MLPConfig"):
        build_model("mlp", Other(), image_spec((1, 28, 28)))


def test_unknown_model_name_suggests_the_closest():
    with pytest.raises(ConfigError, match="cnn_mnist"):
        build_model("cnn_mnsit", {}, image_spec((1, 28, 28)))
