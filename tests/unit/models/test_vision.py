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
- simple_cnn, 3x32x32 (FedGuCci's CIFAR-10 SimpleCNN): 32 -conv3-> 30 -pool-> 15 -conv3-> 13
  -pool-> 6 -conv3-> 4, flatten 64*16 = 1024. 3*32*9+32 = 896 + 32*64*9+64 = 18,496 +
  64*64*9+64 = 36,928 + 1024*64+64 = 65,600 + 64*10+10 = 650; total 122,570.
- simple_cnn, 1x28x28: 28 -> 26 -> 13 -> 11 -> 5 -> 3, flatten 576. 1*32*9+32 = 320 + 18,496 +
  36,928 + 576*64+64 = 36,928 + 650; total 93,322.
- cnn_digit5, 3x28x28 (IMA's code): pad-2 convs keep the size, pools 28 -> 14 -> 7 -> 3, flatten
  128*9 = 1152. 3*64*25+64 = 4,864 + GN 128 + 64*64*25+64 = 102,464 + GN 128 + 64*128*25+128 =
  204,928 + GN 256 + 1152*384+384 = 442,752 + 384*128+128 = 49,280 + 128*10+10 = 1,290; total
  806,090.
- cnn_digit5, 1x28x28: the first conv has 1*64*25+64 = 1,664 instead of 4,864: 802,890.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import nn

from raysim import params as P
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
        ("simple_cnn", (3, 32, 32), 10, 122_570),
        ("simple_cnn", (1, 28, 28), 10, 93_322),
        ("cnn_digit5", (3, 28, 28), 10, 806_090),
        ("cnn_digit5", (1, 28, 28), 10, 802_890),
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


@pytest.mark.parametrize(
    "name", ["mlp", "cnn_mnist", "cnn_fmnist", "cnn_cifar", "cnn_pfl", "simple_cnn", "cnn_digit5"]
)
def test_construction_is_deterministic_under_a_seed(name):
    spec = image_spec((3, 32, 32))

    def build(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, {}, spec).state_dict()

    first, again, other = build(0), build(0), build(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize(
    "name", ["cnn_mnist", "cnn_fmnist", "cnn_cifar", "cnn_pfl", "simple_cnn", "cnn_digit5"]
)
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


def conv(x, module, padding=0):
    """The conv ``module`` with the padding the paper gives (stride 1), whatever the module's own."""
    return F.conv2d(x, module.weight, module.bias, padding=padding)


def layers_of(model, kind):
    return [m for m in model.modules() if isinstance(m, kind)]


def ima_fmnist_cnn(model, x):
    """IMA's CNN (Zhou et al., IEEE TMC 2024, arXiv:2305.07845): Conv(1->32, 5x5, no pad) - ReLU -
    MaxPool2, Conv(32->32, 5x5) - ReLU - MaxPool2, FC(512, 384) - ReLU - FC(384, 128) - ReLU -
    FC(128, 10); the CIFAR CNN alike."""
    conv1, conv2 = layers_of(model, nn.Conv2d)
    fc1, fc2, fc3 = layers_of(model, nn.Linear)
    x = F.max_pool2d(F.relu(conv(x, conv1)), 2)
    x = F.max_pool2d(F.relu(conv(x, conv2)), 2)
    return fc3(F.relu(fc2(F.relu(fc1(x.flatten(1))))))


def fedgucci_simple_cnn(model, x):
    """FedGuCci's code (models_dict/cnn.py CNNCifar10): pool(relu(conv1)), pool(relu(conv2)),
    relu(conv3), relu(fc(1024, 64)), fc(64, C)."""
    conv1, conv2, conv3 = layers_of(model, nn.Conv2d)
    fc1, fc2 = layers_of(model, nn.Linear)
    x = F.max_pool2d(F.relu(conv(x, conv1)), 2)
    x = F.max_pool2d(F.relu(conv(x, conv2)), 2)
    x = F.relu(conv(x, conv3))
    return fc2(F.relu(fc1(x.flatten(1))))


def ima_digit_cnn(model, x):
    """IMA's code (model.py, mixed_digit_gn): pool(relu(gn(conv 5x5 pad 2))) three times, then
    relu(fc1), fc2 without ReLU, classifier."""
    convs = layers_of(model, nn.Conv2d)
    norms = layers_of(model, nn.GroupNorm)
    fc1, fc2, fc3 = layers_of(model, nn.Linear)
    for conv_layer, norm in zip(convs, norms):
        x = F.group_norm(conv(x, conv_layer, padding=2), 2, norm.weight, norm.bias)
        x = F.max_pool2d(F.relu(x), 2)
    return fc3(fc2(F.relu(fc1(x.flatten(1)))))


@pytest.mark.parametrize(
    ("name", "shape", "reference"),
    [
        ("cnn_fmnist", (1, 28, 28), ima_fmnist_cnn),
        ("cnn_cifar", (3, 32, 32), ima_fmnist_cnn),
        ("simple_cnn", (3, 32, 32), fedgucci_simple_cnn),
        ("cnn_digit5", (3, 28, 28), ima_digit_cnn),
    ],
)
def test_cnns_compute_the_papers_layer_sequence(name, shape, reference):
    """Recomputed with torch.nn.functional in the order the papers (and the authors' code) give."""
    torch.manual_seed(0)
    model = build_model(name, {}, image_spec(shape))
    for norm in layers_of(model, nn.GroupNorm):  # non-trivial affine parameters
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    x = torch.randn(3, *shape)
    with torch.no_grad():
        assert torch.allclose(model(x), reference(model, x), atol=1e-5)


def test_cnn_digit5_features_are_the_projector_output_and_its_head_the_classifier():
    """IMA's code (model.py) anchors FedFA on fc2's 128-d output, which no ReLU follows."""
    model = build_model("cnn_digit5", {}, image_spec((3, 28, 28)))
    blocks = model.blocks()
    assert list(blocks) == ["conv1", "conv2", "conv3", "fc1", "projector", "head"]
    projector, classifier = blocks["projector"], model.head
    assert isinstance(projector, nn.Linear) and isinstance(classifier, nn.Linear)
    assert (projector.in_features, projector.out_features) == (384, 128)
    assert (classifier.in_features, classifier.out_features) == (128, 10)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        hidden = model[:-2](x)  # fc1's ReLU output
        assert hidden.shape == (2, 384) and (hidden >= 0).all()
        assert torch.equal(model.features(x), projector(hidden))
        assert (model.features(x) < 0).any()  # no ReLU after the projector


@pytest.mark.parametrize("name", ["simple_cnn", "cnn_digit5"])
def test_new_cnns_have_no_buffers_so_averaging_needs_no_norm_statistics(name):
    model = build_model(name, {}, image_spec((3, 32, 32)))
    assert list(model.buffers()) == []
    assert sorted(P.model_params(model)) == sorted(key for key, _ in model.named_parameters())


def test_cnn_digit5_num_groups_must_divide_the_conv_widths():
    with pytest.raises(ValueError, match="num_groups 3 must divide width 64; choose a divisor of 64"):
        build_model("cnn_digit5", {"num_groups": 3}, image_spec((3, 28, 28)))
    with pytest.raises(ConfigError, match="model.num_groups"):
        build_model("cnn_digit5", {"num_groups": 0}, image_spec((3, 28, 28)))
