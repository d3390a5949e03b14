"""Classic plain deep CNNs: VGG-11 and AlexNet, as FedGuCci and IMA train them from scratch.

VGG-11 (Simonyan & Zisserman, ICLR 2015, arXiv:1409.1556) in kuangliu's CIFAR variant: eight 3x3
convs (pad 1, with bias) [64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M], each followed by
its norm (if any) and a ReLU, "M" a 2x2 max-pool, then a linear classifier on the flattened maps
(512 features at 32x32). FedGuCci (Li et al., KDD 2025, arXiv:2402.18949, App. A.2) uses it
without norm on Fashion-MNIST resized to 1x32x32; IMA (Zhou et al., IEEE TMC 2024,
arXiv:2305.07845, Table IV) with GroupNorm(2) and a linear projector FC(512, 128) on CIFAR-100.
kuangliu's trailing AvgPool2d(kernel_size=1) is the identity and is left out.

AlexNet (Krizhevsky et al., NeurIPS 2012) as IMA's AlexNet-GN for PACS (IMA paper, Table IV): torchvision's
conv stack with GroupNorm(32) after each conv, AdaptiveAvgPool(6, 6), then FC(9216, 1024) - ReLU -
FC(1024, 512) - ReLU - FC(512, C), without dropout. Its pools need images of at least 63x63 (PACS
is 224x224).

Both are ``BlockSequential``s (see ``vision.py``): blocks "conv1", ..., then VGG's "flatten" or
AlexNet's "pool", "fc1", "fc2", then VGG's "projector" if it has one (its output is the features),
and the "head", the final linear classifier.
"""

from __future__ import annotations

from pydantic import PositiveInt
from torch import nn

from raysim.models.max_pool import MaxPool2d
from raysim.models.vision import BlockSequential, NormKind, classifier, image_shape, make_norm
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

VGG11_LAYERS: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
ALEXNET_WIDTHS = (64, 192, 384, 256, 256)


class VGG11Config(ModelConfig, frozen=True, extra="forbid"):
    """VGG-11, CIFAR variant (arXiv:1409.1556) of FedGuCci (arXiv:2402.18949) and IMA (arXiv:2305.07845)."""

    norm: NormKind = "batch"  # kuangliu's BatchNorm; FedGuCci "none", IMA "group"
    num_groups: PositiveInt = 2  # GroupNorm groups; must divide 64 (every conv width)
    projector: PositiveInt | None = None  # IMA: FC(512, projector) then FC(projector, C); no ReLU


class AlexNetGNConfig(ModelConfig, frozen=True, extra="forbid"):
    """IMA's AlexNet with GroupNorm (arXiv:2305.07845) for 224x224 PACS; no dropout."""

    num_groups: PositiveInt = 32  # GroupNorm groups; must divide 64 (every conv width)


@register("model", "vgg11", config=VGG11Config)
def build_vgg11(config: VGG11Config, spec: DataSpec) -> BlockSequential:
    """VGG-11, CIFAR variant: 9,225,610 params on 3x32x32 with 10 classes and no norm.

    Blocks "conv1" ... "conv8" (conv, norm, ReLU, and the max-pool that follows it, if any),
    "flatten", "projector" (with ``projector``: IMA's linear FC(512, projector), no ReLU, whose
    output is the features) and "head" (the classifier). Needs images of at least 32x32: FedGuCci
    resizes Fashion-MNIST.
    """
    channels, _, _ = image_shape(spec, "vgg11")
    widths = [width for width in VGG11_LAYERS if isinstance(width, int)]
    norm = make_norm(config.norm, config.num_groups, widths, "vgg11")
    convs: dict[str, list[nn.Module]] = {}
    name = ""
    for layer in VGG11_LAYERS:
        if isinstance(layer, str):  # "M": a max-pool closes the block of the conv before it
            convs[name].append(MaxPool2d(2))
            continue
        name = f"conv{len(convs) + 1}"
        normalise = [] if config.norm == "none" else [norm(layer)]  # no Identity in the state dict
        convs[name] = [nn.Conv2d(channels, layer, 3, padding=1), *normalise, nn.ReLU()]
        channels = layer
    return classifier(convs, [], spec, "vgg11", projector=config.projector)


@register("model", "alexnet_gn", config=AlexNetGNConfig)
def build_alexnet_gn(config: AlexNetGNConfig, spec: DataSpec) -> BlockSequential:
    """IMA's AlexNet-GN: 12,438,599 params on 3x224x224 with 7 classes (PACS).

    Blocks "conv1" ... "conv5" (conv, GroupNorm, ReLU, and a 3x3 stride-2 max-pool after convs
    1, 2 and 5), "pool" (adaptive average to 6x6), "fc1", "fc2" and "head"; features are 512-d.
    """
    channels, _, _ = image_shape(spec, "alexnet_gn")
    norm = make_norm("group", config.num_groups, ALEXNET_WIDTHS, "alexnet_gn")
    shapes = [(11, 4, 2), (5, 1, 2), (3, 1, 1), (3, 1, 1), (3, 1, 1)]  # kernel, stride, padding
    convs: dict[str, list[nn.Module]] = {}
    for index, (width, (kernel, stride, padding)) in enumerate(zip(ALEXNET_WIDTHS, shapes), start=1):
        conv = nn.Conv2d(channels, width, kernel, stride, padding)
        pool = [MaxPool2d(3, 2)] if index in (1, 2, 5) else []
        convs[f"conv{index}"] = [conv, norm(width), nn.ReLU(), *pool]
        channels = width
    convs["pool"] = [nn.AdaptiveAvgPool2d((6, 6))]
    return classifier(convs, [1024, 512], spec, "alexnet_gn")
