"""Tests of the CIFAR-style ResNets in raysim/models/resnet.py.

Parameter counts at width 64, 10 classes, derived by hand. A 3x3 conv c_in -> c_out has 9*c_in*c_out
weights (no bias); each norm has 2*c affine parameters (BatchNorm and GroupNorm alike).

- stem: 3*64*9 = 1,728 + norm 128.
- first block of each stage, BasicBlock(c/2 -> c) with a 1x1 shortcut (the first stage keeps 64):
  64: 2*9*64*64 + 4*64 = 73,984; 128: 73,728 + 147,456 + 512 + (8,192 + 256) = 230,144;
  256: 294,912 + 589,824 + 1,024 + 33,280 = 919,040; 512: 1,179,648 + 2,359,296 + 2,048 +
  132,096 = 3,673,088.
- head: 512*10 + 10 = 5,130.
- resnet10 = 1,728 + 128 + 73,984 + 230,144 + 919,040 + 3,673,088 + 5,130 = 4,903,242.
- each extra block per stage, BasicBlock(c -> c) = 18c^2 + 4c: 73,984 + 295,424 + 1,180,672 +
  4,720,640 = 6,270,720; resnet18 = 4,903,242 + 6,270,720 = 11,173,962 (FuseFL's ResNet-18),
  resnet26 = 11,173,962 + 6,270,720 = 17,444,682.
- resnet18 with projector 128: 11,173,962 - 5,130 + (512*128 + 128) + (128*10 + 10) = 11,235,786.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raysim.models import build_model
from raysim.types import DataSpec

CIFAR = DataSpec("classification", (3, 32, 32), 10)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("resnet10", 4_903_242), ("resnet18", 11_173_962), ("resnet26", 17_444_682)],
)
def test_parameter_counts_with_batch_norm(name, expected):
    assert num_params(build_model(name, {}, CIFAR)) == expected


def test_projector_head_parameter_count():
    model = build_model("resnet18", {"norm": "group", "projector": 128}, CIFAR)
    assert num_params(model) == 11_235_786
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_group_norm_variant_has_no_batch_norm_and_no_running_stats():
    model = build_model("resnet18", {"norm": "group", "num_groups": 2}, CIFAR)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert list(model.buffers()) == []
    assert len(norms) == 1 + 8 * 2 + 3  # stem, two per block, three shortcuts
    assert all(m.num_groups == 2 for m in norms)
    assert num_params(model) == 11_173_962  # GroupNorm has the same affine parameters as BN


def test_group_norm_output_does_not_depend_on_train_mode():
    """Without batch statistics, train and eval mode compute the same function."""
    torch.manual_seed(0)
    group = build_model("resnet10", {"norm": "group", "width": 8}, CIFAR)
    batch = build_model("resnet10", {"width": 8}, CIFAR)
    x = torch.randn(4, 3, 32, 32)
    assert torch.allclose(group.train()(x), group.eval()(x))
    assert not torch.allclose(batch.train()(x), batch.eval()(x))


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28), (3, 64, 64)])
def test_output_shape_for_several_image_sizes(shape):
    spec = DataSpec("classification", shape, 7)
    model = build_model("resnet10", {"width": 8}, spec)
    assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_convs_use_kaiming_normal_fan_out_init():
    """Kaiming fan_out gives std sqrt(2 / (512 * 9)) = 0.0208; torch's default would give 0.0085."""
    torch.manual_seed(0)
    model = build_model("resnet18", {}, CIFAR)
    weight = model.layers[3][1].conv2.weight  # 512 -> 512, 3x3: 2.4M samples
    assert weight.std().item() == pytest.approx((2 / (512 * 9)) ** 0.5, rel=0.01)


def test_construction_is_deterministic_under_a_seed():
    def build(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model("resnet10", {"norm": "group", "width": 16}, CIFAR).state_dict()

    first, again, other = build(0), build(0), build(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_num_groups_must_divide_the_width():
    with pytest.raises(ValueError, match="num_groups 3 must divide width 64"):
        build_model("resnet18", {"norm": "group", "num_groups": 3}, CIFAR)


@pytest.mark.parametrize(
    "spec",
    [DataSpec("classification", (3072,), 10), DataSpec("causal_lm", (3, 32, 32), 10)],
)
def test_rejects_specs_that_are_not_images(spec):
    with pytest.raises(ValueError, match="resnet18"):
        build_model("resnet18", {}, spec)
