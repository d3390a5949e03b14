"""CIFAR-style ResNets (He et al. 2016, arXiv:1512.03385) with BatchNorm, GroupNorm or no norm.

The CIFAR variant has a 3x3 stride-1 stem and no max-pool, then stages of BasicBlocks with widths
w, 2w, 4w, ... (strides 1, 2, 2, ...), a global average pool and a linear head. ResNet-10/18/26
have four stages from w = 64 and 1x1-conv ("option B") shortcuts where the shape changes; the
paper's own CIFAR ResNet-20 has three stages from w = 16 and parameter-free "option A" shortcuts
(subsample, zero-pad the new channels). GroupNorm replaces BatchNorm in non-IID FL (Hsieh et al.
2020, arXiv:1910.00189): batch statistics differ across clients and cannot be averaged
meaningfully; FedGuCci (arXiv:2402.18949, App. A.2) removes the norms instead. IMA's ResNet-18-GN
uses 2 groups and a linear projector FC(512, 128) before the classifier.

Anatomy (``anatomy.py``): ``features(x)`` is the pooled output of the last stage, or with a
projector the projector's output (the feature IMA's FedFA anchors), and ``head`` the linear
classifier. The blocks are "stem" (conv, norm, ReLU), one per BasicBlock named by stage and index
("layer1.0", "layer1.1", ..., "layer4.1" for ResNet-18), "pool" (global average, no parameters),
"projector" (only with one) and "head". Split points may name a stage ("layer2": after its last
block), which fits every depth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from pydantic import PositiveInt
from torch import nn

from raysim.models.anatomy import GlobalAvgPool
from raysim.models.vision import Norm, NormKind, image_shape
from raysim.models.vision import make_norm as norm_factory
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

Shortcut = Callable[[int, int, int, Norm], nn.Module]  # (in, out, stride, norm) -> shortcut


class ResNetConfig(ModelConfig, frozen=True, extra="forbid"):
    """CIFAR-style ResNet with BatchNorm, GroupNorm or no norm: the options every depth shares."""

    norm: NormKind = "batch"  # "none": FedGuCci's norm-free ResNets
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


class ResNet20Config(ResNetConfig, frozen=True, extra="forbid"):
    """He et al.'s CIFAR ResNet-20 (arXiv:1512.03385): 16-32-64 wide, option-A shortcuts, 0.27M params."""

    width: PositiveInt = 16  # channels of the first stage; later stages use 2x, 4x


def conv_shortcut(in_channels: int, out_channels: int, stride: int, norm: Norm) -> nn.Module:
    """He et al.'s option B: a strided 1x1 conv and a norm."""
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), norm(out_channels))


def zero_pad_shortcut(in_channels: int, out_channels: int, stride: int, norm: Norm) -> nn.Module:
    """He et al.'s option A, parameter-free (``norm`` is unused)."""
    return ZeroPadShortcut(in_channels, out_channels, stride)


class ZeroPadShortcut(nn.Module):
    """Keeps every ``stride``-th pixel and zero-pads the channels, half before and half after.

    For the usual doubling (c -> 2c) this is the reference code's ``F.pad(x[:, :, ::2, ::2],
    (0, 0, 0, 0, 2c // 4, 2c // 4))`` (Idelbayev's pytorch_resnet_cifar10, used by FedGuCci).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.before = (out_channels - in_channels) // 2
        self.after = out_channels - in_channels - self.before

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return nn.functional.pad(x, (0, 0, 0, 0, self.before, self.after))


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection; ``shortcut`` builds the path when the shape changes."""

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, norm: Norm, shortcut: Shortcut
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.norm1 = norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.norm2 = norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = shortcut(in_channels, out_channels, stride, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def init_convs(model: nn.Module) -> None:
    """Kaiming-normal conv weights (fan_out, as torchvision); norms start as the identity."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def init_kaiming_fan_in(model: nn.Module) -> None:
    """Kaiming-normal (fan_in) weights of every conv and linear layer, biases as torch leaves them:
    the ResNet-20 reference code's ``_weights_init`` (Idelbayev), which FedGuCci uses."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(module.weight)


class ResNet(nn.Module):
    """CIFAR-style ResNet of BasicBlocks: images (B, C, H, W) -> logits (B, num_classes).

    ``blocks`` gives the BasicBlocks per stage; ``shortcut`` and ``init`` default to the
    torchvision-style ResNet-18 (1x1-conv shortcuts, ``init_convs``).
    """

    def __init__(
        self,
        blocks: Sequence[int],
        config: ResNetConfig,
        spec: DataSpec,
        model: str,
        shortcut: Shortcut = conv_shortcut,
        init: Callable[[nn.Module], None] = init_convs,
    ) -> None:
        super().__init__()
        channels, _, _ = image_shape(spec, model)
        norm = make_norm(config, model)
        width = config.width
        self.conv1 = nn.Conv2d(channels, width, 3, 1, padding=1, bias=False)
        self.norm1 = norm(width)
        stages, in_channels = [], width
        for index, num_blocks in enumerate(blocks):
            out_channels, stride = width * 2**index, 1 if index == 0 else 2
            stages.append(make_stage(in_channels, out_channels, num_blocks, stride, norm, shortcut))
            in_channels = out_channels
        self.layers = nn.Sequential(*stages)
        # IMA's linear projector: no ReLU after it, so it ends the features, not the head
        self.projector: nn.Linear | None = (
            None if config.projector is None else nn.Linear(in_channels, config.projector)
        )
        self.head = nn.Linear(config.projector or in_channels, spec.num_classes)
        init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # (B, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The globally average-pooled output of the last stage, (B, 8w) for four stages; with a
        projector its output, (B, projector)."""
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.layers(out)  # (B, 8w, H/8, W/8) for four stages
        pooled = out.mean(dim=(2, 3))
        return pooled if self.projector is None else self.projector(pooled)

    def blocks(self) -> dict[str, nn.Module]:
        """The blocks in order: "stem", each BasicBlock ("layer1.0", ...), "pool", "projector"
        (only with one) and "head"."""
        stem = nn.Sequential(self.conv1, self.norm1, nn.ReLU())
        stages = {
            f"layer{stage}.{index}": block
            for stage, blocks in enumerate(self.layers, start=1)
            for index, block in enumerate(blocks.children())
        }
        projector = {} if self.projector is None else {"projector": self.projector}
        return {"stem": stem, **stages, "pool": GlobalAvgPool(), **projector, "head": self.head}


def make_stage(
    in_channels: int, out_channels: int, num_blocks: int, stride: int, norm: Norm, shortcut: Shortcut
) -> nn.Sequential:
    """A stage of ``num_blocks`` BasicBlocks; the first one changes width and resolution."""
    blocks = [BasicBlock(in_channels, out_channels, stride, norm, shortcut)]
    blocks += [BasicBlock(out_channels, out_channels, 1, norm, shortcut) for _ in range(num_blocks - 1)]
    return nn.Sequential(*blocks)


def make_norm(config: ResNetConfig, model: str) -> Norm:
    """Returns the normalisation layer factory ``config`` asks for ("none": identities).

    Raises:
        ValueError: ``num_groups`` does not divide the first stage's width (nor, therefore, the
            later ones, which are multiples of it).
    """
    return norm_factory(config.norm, config.num_groups, [config.width], model)


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


@register("model", "resnet20", config=ResNet20Config)
def build_resnet20(config: ResNet20Config, spec: DataSpec) -> ResNet:
    """He et al.'s CIFAR ResNet-20 (arXiv:1512.03385, Sec. 4.2): 269,722 params with 10 classes.

    Three stages of three BasicBlocks at widths 16, 32, 64, option-A (zero-padding) shortcuts and
    Kaiming fan_in init, as the reference code FedGuCci trains on CIFAR-100 (arXiv:2402.18949,
    App. A.2). FedGuCci's paper removes the norms (``norm: none``) while its code keeps BatchNorm.
    The convs have no bias (``bias=False``, as the reference code), also under ``norm: none``: the
    norm-free ResNet-20 has no per-channel offsets, and its only biases are the linear layers'.
    """
    return ResNet((3, 3, 3), config, spec, "resnet20", zero_pad_shortcut, init_kaiming_fan_in)
