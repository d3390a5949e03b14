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

ResNet-20 (widths 16, 32, 64; three blocks per stage; option-A shortcuts have no parameters),
10 classes, worked out in ``RESNET20_BATCH_NORM`` below: 269,722 (He et al.'s "0.27M").
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raysim import params as P
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.resnet import ZeroPadShortcut
from raysim.types import DataSpec

CIFAR = DataSpec("classification", (3, 32, 32), 10)


def conv3x3(c_in: int, c_out: int) -> int:
    return 9 * c_in * c_out


def block(c_in: int, c: int, norm: int) -> int:
    """A BasicBlock c_in -> c: two 3x3 convs and two norms of 2c affine parameters (if any)."""
    return conv3x3(c_in, c) + conv3x3(c, c) + 2 * norm * 2 * c


def resnet20(norm: int, classes: int = 10) -> int:
    """Stem 3 -> 16, stages of three blocks (the first one widens; option A adds nothing), head."""
    stem = conv3x3(3, 16) + norm * 2 * 16
    stage1 = 3 * block(16, 16, norm)
    stage2 = block(16, 32, norm) + 2 * block(32, 32, norm)
    stage3 = block(32, 64, norm) + 2 * block(64, 64, norm)
    return stem + stage1 + stage2 + stage3 + 64 * classes + classes


# stem 432 + 32; stage 1 3*(4,608 + 64) = 14,016; stage 2 (4,608 + 9,216 + 128) + 2*(18,432 + 128)
# = 51,072; stage 3 (18,432 + 36,864 + 256) + 2*(73,728 + 256) = 203,520; head 650.
RESNET20_BATCH_NORM = 432 + 32 + 14_016 + 51_072 + 203_520 + 650


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("resnet10", 4_903_242), ("resnet18", 11_173_962), ("resnet26", 17_444_682)],
)
def test_parameter_counts_with_batch_norm(name, expected):
    assert num_params(build_model(name, {}, CIFAR)) == expected


def test_projector_parameter_count():
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


def test_resnet20_parameter_counts():
    assert RESNET20_BATCH_NORM == resnet20(norm=1) == 269_722
    assert num_params(build_model("resnet20", {}, CIFAR)) == 269_722
    assert num_params(build_model("resnet20", {"norm": "group", "num_groups": 4}, CIFAR)) == 269_722
    # without norms: 1,376 fewer (2*(16 + 6*16 + 6*32 + 6*64)); CIFAR-100 head 64*100 + 100
    cifar100 = DataSpec("classification", (3, 32, 32), 100)
    assert resnet20(norm=0, classes=100) == 269_722 - 1_376 - 650 + 6_500
    assert num_params(build_model("resnet20", {"norm": "none"}, cifar100)) == 274_196


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28)])
@pytest.mark.parametrize("norm", ["batch", "group", "none"])
def test_resnet20_output_shape(shape, norm):
    spec = DataSpec("classification", shape, 10)
    model = build_model("resnet20", {"norm": norm}, spec)
    assert model(torch.randn(2, *shape)).shape == (2, 10)
    assert model.features(torch.randn(2, *shape)).shape == (2, 64)


def test_resnet20_option_a_shortcuts_have_no_parameters_and_pad_as_the_reference_code():
    """Idelbayev's (and FedGuCci's) option A: F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, c//4, c//4))."""
    model = build_model("resnet20", {}, CIFAR)
    shortcuts = [b.shortcut for stage in model.layers for b in stage]
    padded = [s for s in shortcuts if isinstance(s, ZeroPadShortcut)]
    assert len(padded) == 2  # the first block of stages 2 and 3
    assert all(isinstance(s, nn.Identity) for s in shortcuts if s not in padded)
    assert not any(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in model.modules())
    assert [list(s.parameters()) + list(s.buffers()) for s in padded] == [[], []]
    x = torch.randn(2, 16, 32, 32)
    expected = nn.functional.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, 32 // 4, 32 // 4), "constant", 0)
    assert torch.equal(padded[0](x), expected)
    assert padded[0](x).shape == (2, 32, 16, 16)


def reference_resnet20_without_norms(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The reference code's forward with its BN layers removed (FedGuCci, App. A.2), from the
    model's conv weights in order: stem, then per block relu(conv2(relu(conv1 x)) + shortcut x)."""
    convs = iter(m.weight for m in model.modules() if isinstance(m, nn.Conv2d))
    out = torch.relu(nn.functional.conv2d(x, next(convs), padding=1))
    for stage in range(3):
        for index in range(3):
            stride = 2 if stage > 0 and index == 0 else 1
            mid = torch.relu(nn.functional.conv2d(out, next(convs), stride=stride, padding=1))
            res = nn.functional.conv2d(mid, next(convs), padding=1)
            if stride == 2:
                planes = res.shape[1]
                out = nn.functional.pad(out[:, :, ::2, ::2], (0, 0, 0, 0, planes // 4, planes // 4))
            out = torch.relu(res + out)
    pooled = nn.functional.avg_pool2d(out, out.size()[3]).flatten(1)
    head = model.head
    assert isinstance(head, nn.Linear)
    return nn.functional.linear(pooled, head.weight, head.bias)


def test_resnet20_without_norms_matches_the_reference_forward():
    torch.manual_seed(0)
    model = build_model("resnet20", {"norm": "none"}, CIFAR)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), reference_resnet20_without_norms(model, x), atol=1e-5)


def test_resnet20_uses_the_reference_codes_kaiming_fan_in_init():
    """kaiming_normal_ (fan_in, gain sqrt 2) on convs and the head: the first conv of stage 3
    (32 -> 64, 3x3) has std sqrt(2 / 288) = 0.083 (fan_out would give 0.059); the head std
    sqrt(2 / 64) = 0.177 (torch's default uniform(+-1/8) has std 0.072)."""
    torch.manual_seed(0)
    model = build_model("resnet20", {}, CIFAR)
    widening = model.layers[2][0].conv1.weight  # 18,432 samples
    assert widening.std().item() == pytest.approx((2 / 288) ** 0.5, rel=0.03)
    assert model.head.weight.std().item() == pytest.approx((2 / 64) ** 0.5, rel=0.15)


def test_resnet20_blocks_and_split_points():
    model = build_model("resnet20", {"norm": "group"}, CIFAR)
    stages = [f"layer{s}.{i}" for s in (1, 2, 3) for i in range(3)]
    assert list(model.blocks()) == ["stem", *stages, "pool", "head"]


@pytest.mark.parametrize(
    ("name", "options"), [("resnet20", {"norm": "none"}), ("resnet18", {"norm": "none", "width": 8})]
)
def test_norm_free_resnets_have_no_norm_layers_and_no_buffers(name, options):
    model = build_model(name, options, CIFAR)
    assert not any(isinstance(m, (nn.GroupNorm, nn.modules.batchnorm._BatchNorm)) for m in model.modules())
    assert list(model.buffers()) == []
    assert sorted(P.model_params(model)) == sorted(key for key, _ in model.named_parameters())


def test_resnet18_without_norms_parameter_count():
    """Every norm of resnet18 at width 64 removed: stem 2*64; per stage of width c, four norms in
    the blocks and (stages 2-4) one in the shortcut, each 2c."""
    norms = 2 * 64 + 4 * 2 * 64 + 5 * 2 * 128 + 5 * 2 * 256 + 5 * 2 * 512
    assert num_params(build_model("resnet18", {"norm": "none"}, CIFAR)) == 11_173_962 - norms


def test_resnet20_num_groups_must_divide_the_width_and_bad_options_are_config_errors():
    with pytest.raises(ValueError, match="num_groups 32 must divide width 16"):
        build_model("resnet20", {"norm": "group", "num_groups": 32}, CIFAR)
    with pytest.raises(ConfigError, match="model.norm"):
        build_model("resnet20", {"norm": "layer"}, CIFAR)
