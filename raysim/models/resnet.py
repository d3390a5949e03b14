"""CIFAR-style ResNets (He et al. 2016, arXiv:1512.03385) with BatchNorm or GroupNorm.

The CIFAR variant has a 3x3 stride-1 stem and no max-pool, then four stages of BasicBlocks with
widths w, 2w, 4w, 8w (strides 1, 2, 2, 2), a global average pool and a linear head. GroupNorm
replaces BatchNorm in non-IID FL (Hsieh et al. 2020, arXiv:1910.00189): batch statistics differ
across clients and cannot be averaged meaningfully. IMA's ResNet-18-GN uses 2 groups and a linear
projector FC(512, 128) before the classifier.

Anatomy (``anatomy.py``): ``features(x)`` is the pooled (B, 8w) output of the last stage and
``head`` the linear classifier (with a projector: the projector and the classifier). The blocks
are "stem" (conv, norm, ReLU), one per BasicBlock named by stage and index ("layer1.0",
"layer1.1", ..., "layer4.1" for ResNet-18), "pool" (global average, no parameters) and "head".
Split points may name a stage ("layer2": after its last block), which fits every depth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from pydantic import PositiveInt
from torch import nn

from raysim.models.anatomy import GlobalAvgPool
from raysim.models.vision import image_shape
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

Norm = Callable[[int], nn.Module]  # channels -> normalisation layer


class ResNetConfig(ModelConfig, frozen=True, extra="forbid"):
    """CIFAR-style ResNet with BatchNorm or GroupNorm: the options every depth shares."""

    norm: Literal["batch", "group"] = "batch"
    num_groups: PositiveInt = 2  # GroupNorm groups; must divide every stage width
    width: PositiveInt = 64  # channels of the first stage; later stages use 2x, 4x, 8x
    projector: PositiveInt | None = None  # IMA: FC(8w, projector) then FC(projector, C); no ReLU


# One Config per depth: the registry shows each Config's first docstring line as the summary.
class ResNet10Config(ResNetConfig, frozen=True, extra="forbid"):
    """CIFAR-style ResNet-10: one BasicBlock per stage, 4.9M params at width 64."""


class ResNet18Config(ResNetConfig, frozen=True, extra="forbid"):
    """CIFAR-style ResNet-18: two BasicBlocks per stage, 11.2M params at width 64."""


class ResNet26Config(ResNetConfig, frozen=True, extra="forbid"):
    """CIFAR-style ResNet-26: three BasicBlocks per stage, 17.4M params at width 64."""


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection; a 1x1 conv shortcut when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: Norm) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.norm1 = norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.norm2 = norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), norm(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet of BasicBlocks: images (B, C, H, W) -> logits (B, num_classes)."""

    def __init__(self, blocks: Sequence[int], config: ResNetConfig, spec: DataSpec, model: str) -> None:
        super().__init__()
        channels, _, _ = image_shape(spec, model)
        norm = make_norm(config, model)
        width = config.width
        self.conv1 = nn.Conv2d(channels, width, 3, 1, padding=1, bias=False)
        self.norm1 = norm(width)
        stages, in_channels = [], width
        for index, num_blocks in enumerate(blocks):
            out_channels, stride = width * 2**index, 1 if index == 0 else 2
            stages.append(make_stage(in_channels, out_channels, num_blocks, stride, norm))
            in_channels = out_channels
        self.layers = nn.Sequential(*stages)
        self.head = make_head(in_channels, config.projector, spec.num_classes)
        init_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # (B, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The globally average-pooled output of the last stage: (B, 8w)."""
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.layers(out)  # (B, 8w, H/8, W/8)
        return out.mean(dim=(2, 3))

    def blocks(self) -> dict[str, nn.Module]:
        """The blocks in order: "stem", each BasicBlock ("layer1.0", ...), "pool" and "head"."""
        stem = nn.Sequential(self.conv1, self.norm1, nn.ReLU())
        stages = {
            f"layer{stage}.{index}": block
            for stage, blocks in enumerate(self.layers, start=1)
            for index, block in enumerate(blocks.children())
        }
        return {"stem": stem, **stages, "pool": GlobalAvgPool(), "head": self.head}


def make_stage(
    in_channels: int, out_channels: int, num_blocks: int, stride: int, norm: Norm
) -> nn.Sequential:
    """A stage of ``num_blocks`` BasicBlocks; the first one changes width and resolution."""
    blocks = [BasicBlock(in_channels, out_channels, stride, norm)]
    blocks += [BasicBlock(out_channels, out_channels, 1, norm) for _ in range(num_blocks - 1)]
    return nn.Sequential(*blocks)


def make_norm(config: ResNetConfig, model: str) -> Norm:
    """Returns the normalisation layer factory ``config`` asks for.

    Raises:
        ValueError: ``num_groups`` does not divide the width of every stage.
    """
    if config.norm == "batch":
        return nn.BatchNorm2d
    if config.width % config.num_groups:
        raise ValueError(f"model {model!r}: num_groups {config.num_groups} must divide width {config.width}")
    return lambda channels: nn.GroupNorm(config.num_groups, channels)


def make_head(features: int, projector: int | None, num_classes: int) -> nn.Module:
    """A linear classifier, or IMA's linear projector followed by one."""
    if projector is None:
        return nn.Linear(features, num_classes)
    return nn.Sequential(nn.Linear(features, projector), nn.Linear(projector, num_classes))


def init_convs(model: nn.Module) -> None:
    """Kaiming-normal conv weights (fan_out, as torchvision); norms start as the identity."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


@register("model", "resnet10", config=ResNet10Config)
def build_resnet10(config: ResNet10Config, spec: DataSpec) -> ResNet:
    """CIFAR-style ResNet-10: one BasicBlock per stage."""
    return ResNet((1, 1, 1, 1), config, spec, "resnet10")


@register("model", "resnet18", config=ResNet18Config)
def build_resnet18(config: ResNet18Config, spec: DataSpec) -> ResNet:
    """CIFAR-style ResNet-18: 11,173,962 params at width 64 with 10 classes."""
    return ResNet((2, 2, 2, 2), config, spec, "resnet18")


@register("model", "resnet26", config=ResNet26Config)
def build_resnet26(config: ResNet26Config, spec: DataSpec) -> ResNet:
    """CIFAR-style ResNet-26: three BasicBlocks per stage."""
    return ResNet((3, 3, 3, 3), config, spec, "resnet26")
