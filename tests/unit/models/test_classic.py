"""Tests of VGG-11 and AlexNet-GN in raysim/models/classic.py.

Parameter counts by hand, as (weights + biases) per layer; every conv has a bias, every norm 2c
affine parameters. VGG-11's convs, 3x3, widths 64, 128, 256, 256, 512, 512, 512, 512:

- 3 -> 64: 1,728 + 64 = 1,792 (1 -> 64 for FedGuCci's FMNIST: 576 + 64 = 640);
  64 -> 128: 73,728 + 128 = 73,856; 128 -> 256: 294,912 + 256 = 295,168;
  256 -> 256: 589,824 + 256 = 590,080; 256 -> 512: 1,179,648 + 512 = 1,180,160;
  512 -> 512 (three): 3 * (2,359,296 + 512) = 7,079,424. Convs: 9,220,480 (3 channels).
- five 2x2 pools take 32x32 to 1x1: flatten 512. Head 512*10 + 10 = 5,130.
- no norm, 3x32x32: 9,225,610 (kuangliu's VGG-11 without BN, ~9.23M); 1x32x32: 9,224,458.
- norms: 2 * (64 + 128 + 256 + 256 + 512 * 4) = 5,504.
- IMA's VGG11-GN, CIFAR-100: convs 9,220,480 + norms 5,504 + FC(512, 128) 65,664 +
  FC(128, 100) 12,900 = 9,304,548.

AlexNet-GN, 3x224x224, 7 classes (PACS): spatial 224 -conv11/4,p2-> 55 -pool3/2-> 27 -conv5,p2->
27 -pool-> 13 -conv3s-> 13 -pool-> 6 -adaptive-> 6, flatten 256*36 = 9216. Convs 3*64*121+64 =
23,296; 64*192*25+192 = 307,392; 192*384*9+384 = 663,936; 384*256*9+256 = 884,992;
256*256*9+256 = 590,080; norms 2*(64+192+384+256+256) = 2,304; FC 9216*1024+1024 = 9,438,208;
1024*512+512 = 524,800; 512*7+7 = 3,591. Total 12,438,599.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim import params as P
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.types import DataSpec

CIFAR = DataSpec("classification", (3, 32, 32), 10)
FMNIST_32 = DataSpec("classification", (1, 32, 32), 10)
CIFAR100 = DataSpec("classification", (3, 32, 32), 100)
PACS = DataSpec("classification", (3, 224, 224), 7)

VGG11_CONVS = 1_792 + 73_856 + 295_168 + 590_080 + 1_180_160 + 7_079_424
VGG11_NORMS = 2 * (64 + 128 + 256 + 256 + 512 * 4)
ALEXNET_CONVS = 23_296 + 307_392 + 663_936 + 884_992 + 590_080
ALEXNET_NORMS = 2 * (64 + 192 + 384 + 256 + 256)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_by_hand():
    assert VGG11_CONVS == 9_220_480 and VGG11_NORMS == 5_504
    assert num_params(build_model("vgg11", {"norm": "none"}, CIFAR)) == VGG11_CONVS + 5_130 == 9_225_610
    assert num_params(build_model("vgg11", {"norm": "none"}, FMNIST_32)) == 9_225_610 - 1_792 + 640
    assert num_params(build_model("vgg11", {}, CIFAR)) == VGG11_CONVS + VGG11_NORMS + 5_130
    ima = build_model("vgg11", {"norm": "group", "projector": 128}, CIFAR100)
    assert num_params(ima) == VGG11_CONVS + VGG11_NORMS + 65_664 + 12_900 == 9_304_548
    alexnet = build_model("alexnet_gn", {}, PACS)
    expected = ALEXNET_CONVS + ALEXNET_NORMS + 9_438_208 + 524_800 + 3_591
    assert num_params(alexnet) == expected == 12_438_599


@pytest.mark.parametrize(
    ("options", "spec", "feature_dim"),
    [
        ({"norm": "none"}, FMNIST_32, 512),
        ({"norm": "group", "projector": 128}, CIFAR100, 128),  # the projector's output
        ({}, CIFAR, 512),
    ],
)
def test_vgg11_output_and_feature_shapes(options, spec, feature_dim):
    model = build_model("vgg11", options, spec)
    x = torch.randn(2, *spec.input_shape)
    assert model(x).shape == (2, spec.num_classes)
    assert model.features(x).shape == (2, feature_dim)


def test_alexnet_gn_output_and_feature_shapes_at_224():
    model = build_model("alexnet_gn", {}, PACS)
    x = torch.randn(2, 3, 224, 224)
    assert model(x).shape == (2, 7)
    assert model.features(x).shape == (2, 512)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("vgg11", (1, 28, 28)), ("alexnet_gn", (3, 32, 32)), ("alexnet_gn", (1, 28, 28))],
)
def test_images_too_small_for_the_pools_are_value_errors(name, shape):
    """VGG-11's five 2x2 pools need 32x32 (FedGuCci resizes FMNIST); AlexNet's three 3x3
    stride-2 pools after a stride-4 conv need 63x63 (PACS is 224x224)."""
    with pytest.raises(ValueError, match=rf"model '{name}': input_shape .* is too small"):
        build_model(name, {}, DataSpec("classification", shape, 10))


def vgg11_reference(model: nn.Module, x: torch.Tensor, num_groups: int | None) -> torch.Tensor:
    """kuangliu's VGG-11 (FedGuCci's models_dict/vgg.py; IMA's vgg11_gn with GroupNorm): conv 3x3
    pad 1, [GroupNorm], ReLU, "M" = 2x2 max-pool, flatten, then the linear layers in order."""
    convs = iter(m for m in model.modules() if isinstance(m, nn.Conv2d))
    norms = iter(m for m in model.modules() if isinstance(m, nn.GroupNorm))
    for layer in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if layer == "M":
            x = F.max_pool2d(x, 2, 2)
            continue
        conv = next(convs)
        assert conv.out_channels == layer
        x = F.conv2d(x, conv.weight, conv.bias, padding=1)
        if num_groups is not None:
            norm = next(norms)
            x = F.group_norm(x, num_groups, norm.weight, norm.bias)
        x = F.relu(x)
    x = x.flatten(1)
    for linear in (m for m in model.modules() if isinstance(m, nn.Linear)):
        x = linear(x)  # IMA's projector and classifier: no ReLU between them
    return x


def alexnet_gn_reference(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """IMA's alexnet_gn (model.py): torchvision's AlexNet convs, GroupNorm(32) after each, no
    dropout; FC(9216, 1024) - ReLU - FC(1024, 512) - ReLU - FC(512, C)."""
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    fc1, fc2, fc3 = (m for m in model.modules() if isinstance(m, nn.Linear))
    geometry = [(4, 2, True), (1, 2, True), (1, 1, False), (1, 1, False), (1, 1, True)]
    for conv, norm, (stride, padding, pool) in zip(convs, norms, geometry):
        x = F.conv2d(x, conv.weight, conv.bias, stride=stride, padding=padding)
        x = F.relu(F.group_norm(x, 32, norm.weight, norm.bias))
        if pool:
            x = F.max_pool2d(x, 3, 2)
    x = F.adaptive_avg_pool2d(x, (6, 6)).flatten(1)
    return fc3(F.relu(fc2(F.relu(fc1(x)))))


def randomise_norms(model: nn.Module) -> None:
    for norm in (m for m in model.modules() if isinstance(m, nn.GroupNorm)):
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)


@pytest.mark.parametrize(
    ("options", "spec", "num_groups"),
    [({"norm": "none"}, FMNIST_32, None), ({"norm": "group", "projector": 128}, CIFAR100, 2)],
)
def test_vgg11_matches_the_reference_forward(options, spec, num_groups):
    torch.manual_seed(0)
    model = build_model("vgg11", options, spec)
    randomise_norms(model)
    x = torch.randn(2, *spec.input_shape)
    with torch.no_grad():
        assert torch.allclose(model(x), vgg11_reference(model, x, num_groups), atol=1e-5)


def test_alexnet_gn_matches_the_reference_forward():
    torch.manual_seed(0)
    model = build_model("alexnet_gn", {}, PACS)
    randomise_norms(model)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(model(x), alexnet_gn_reference(model, x), atol=1e-4)


def test_alexnet_gn_has_no_dropout_and_32_groups():
    model = build_model("alexnet_gn", {}, PACS)
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
    assert [m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)] == [32] * 5


@pytest.mark.parametrize(
    ("name", "options", "spec"),
    [
        ("vgg11", {"norm": "none"}, FMNIST_32),
        ("vgg11", {"norm": "group"}, CIFAR),
        ("alexnet_gn", {}, PACS),
    ],
)
def test_group_norm_and_norm_free_models_have_no_buffers(name, options, spec):
    """Nothing but parameters travels, so averaging needs no BatchNorm statistics."""
    model = build_model(name, options, spec)
    assert list(model.buffers()) == []
    assert sorted(P.model_params(model)) == sorted(key for key, _ in model.named_parameters())


def test_vgg11_norm_none_leaves_no_norm_layers_and_batch_norm_has_statistics():
    plain = build_model("vgg11", {"norm": "none"}, CIFAR)
    assert not any(isinstance(m, (nn.Identity, nn.BatchNorm2d, nn.GroupNorm)) for m in plain.modules())
    batch = build_model("vgg11", {}, CIFAR)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in batch.modules()) == 8


def test_batch_norm_statistics_are_untouched_by_the_flatten_size_probe():
    """The dummy forward that sizes the head runs in eval mode: BatchNorm learns nothing from it."""
    model = build_model("vgg11", {}, CIFAR)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert model.training and all(norm.training for norm in norms)
    assert all(norm.num_batches_tracked.item() == 0 for norm in norms)
    assert all(torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean)) for norm in norms)


def test_vgg11_blocks_and_projector_ends_the_features():
    model = build_model("vgg11", {"norm": "group", "projector": 128}, CIFAR100)
    blocks = model.blocks()
    assert list(blocks) == [*(f"conv{i}" for i in range(1, 9)), "flatten", "projector", "head"]
    # a pool closes blocks 1, 2, 4, 6 and 8
    pooled = [
        name for name, block in blocks.items() if any(isinstance(m, nn.MaxPool2d) for m in block.modules())
    ]
    assert pooled == ["conv1", "conv2", "conv4", "conv6", "conv8"]
    projector, classifier = blocks["projector"], model.head
    assert isinstance(projector, nn.Linear) and isinstance(classifier, nn.Linear)
    assert (projector.in_features, projector.out_features, classifier.out_features) == (512, 128, 100)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # no ReLU after the projector: the features are its raw output
        assert torch.equal(model.features(x), projector(model[:-2](x)))


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "vgg11",
            {"norm": "group", "num_groups": 3},
            "num_groups 3 must divide width 64; choose a divisor of 64",
        ),
        ("alexnet_gn", {"num_groups": 128}, "num_groups 128 must divide width 64; choose a divisor of 64"),
        ("alexnet_gn", {"num_groups": 48}, "num_groups 48 must divide width 64; choose a divisor of 64"),
    ],
)
def test_num_groups_must_divide_every_width(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_model(name, options, PACS if name == "alexnet_gn" else CIFAR)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"norm": "layer"}, "model.norm"),
        ({"projector": 0}, "model.projector"),
        ({"depth": 11}, "model.depth"),
    ],
)
def test_invalid_vgg11_options_are_config_errors(options, key):
    with pytest.raises(ConfigError, match=key):
        build_model("vgg11", options, CIFAR)
