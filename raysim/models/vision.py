"""Small image classifiers: an MLP and the CNNs of FedAvg, IMA, FedGuCci and pfl-research.

Every model takes float32 images (B, C, H, W) and returns logits (B, num_classes). Flatten sizes
come from a dummy forward at build time, so the CNNs accept any image large enough for their convs
(28x28, 32x32, and for ``cnn_mnist`` even the 8x8 sklearn digits).

Each model is a ``BlockSequential`` (see ``anatomy.py``): an ``nn.Sequential``, so its state-dict
keys are "0.weight", "3.bias", ..., whose layers are grouped into named blocks: "conv1", "conv2",
... (conv, its norm if any, ReLU, pool), "fc1", "fc2" (the first one flattens; a dense layer and
its ReLU, and the dropout of ``cnn_pfl``), where a model has one IMA's "projector" (a linear layer
with no ReLU after it), and "head": the final linear classifier. ``features(x)`` is the head's
input, so on a model with a projector it is the projector's output, the feature IMA's FedFA
anchors (TailinZhou/FedIMA, ``model.py``). A model without dense blocks has a "flatten" block, so
the features of an MLP without hidden layers are the flattened input.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch
from pydantic import Field, PositiveInt
from torch import nn

from raysim.models.dropout import Dropout
from raysim.models.max_pool import MaxPool2d
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

# The registry shows each Config's first docstring line as its model's summary.

NormKind = Literal["none", "batch", "group"]
Norm = Callable[[int], nn.Module]  # channels -> normalisation layer


class MLPConfig(ModelConfig, frozen=True, extra="forbid"):
    """Multilayer perceptron on the flattened input: ReLU hidden layers, then logits."""

    hidden: tuple[PositiveInt, ...] = (200, 200)  # hidden widths; () gives logistic regression


class CNNMnistConfig(ModelConfig, frozen=True, extra="forbid"):
    """FedAvg's MNIST CNN (McMahan et al., arXiv:1602.05629): 2 conv 5x5, FC 512; no options."""


class CNNFmnistConfig(ModelConfig, frozen=True, extra="forbid"):
    """IMA's FMNIST CNN (arXiv:2305.07845): 2 conv 5x5 of 32, FC 384 and 128; no options."""


class CNNCifarConfig(ModelConfig, frozen=True, extra="forbid"):
    """IMA's CIFAR CNN (arXiv:2305.07845): 2 conv 5x5 of 64, FC 384 and 128; no options."""


class PflCNNConfig(ModelConfig, frozen=True, extra="forbid"):
    """pfl-research's benchmark CNN (arXiv:2404.06430): 2 conv 3x3, FC 128, with dropout."""

    conv_dropout: float = Field(0.25, ge=0.0, lt=1.0)  # after the max-pool
    fc_dropout: float = Field(0.5, ge=0.0, lt=1.0)  # after the hidden dense layer


class SimpleCNNConfig(ModelConfig, frozen=True, extra="forbid"):
    """FedGuCci's CIFAR-10 SimpleCNN (arXiv:2402.18949): 3 conv 3x3, FC 64; no options."""


class CNNDigit5Config(ModelConfig, frozen=True, extra="forbid"):
    """IMA's Digit-Five CNN-GN (arXiv:2305.07845): 3 conv 5x5 with GroupNorm, FC 384, 128."""

    num_groups: PositiveInt = 2  # GroupNorm groups; must divide 64 (every conv width)


def require_classification(spec: DataSpec, model: str) -> None:
    """Raises ValueError unless ``spec`` is a classification task with at least one class."""
    if spec.task != "classification":
        raise ValueError(f"model {model!r} is a classifier; it cannot serve task {spec.task!r}")
    if spec.num_classes < 1:
        raise ValueError(f"model {model!r} needs num_classes >= 1, got {spec.num_classes}")


def image_shape(spec: DataSpec, model: str) -> tuple[int, int, int]:
    """Returns the (C, H, W) of the images ``spec`` describes.

    Raises:
        ValueError: the task is not classification or the input is not a (C, H, W) image.
    """
    require_classification(spec, model)
    if len(spec.input_shape) != 3:
        raise ValueError(
            f"model {model!r} expects images with input_shape (C, H, W), got {spec.input_shape}; "
            "store greyscale images as (1, H, W)"
        )
    channels, height, width = spec.input_shape
    return channels, height, width


class BlockSequential(nn.Sequential):
    """An ``nn.Sequential`` whose layers are grouped into named blocks, the last being the head.

    Its state dict is the plain ``nn.Sequential``'s; ``blocks()`` and ``head`` share its layers.
    """

    def __init__(self, blocks: Mapping[str, Sequence[nn.Module]]) -> None:
        super().__init__(*(layer for layers in blocks.values() for layer in layers))
        self.block_sizes = tuple((name, len(layers)) for name, layers in blocks.items())

    def __getitem__(self, idx: slice | int) -> nn.Module:
        if isinstance(idx, slice):  # nn.Sequential would pass the slice to our constructor
            return nn.Sequential(OrderedDict(list(self._modules.items())[idx]))
        return super().__getitem__(idx)

    @property
    def head(self) -> nn.Module:
        """The last block: the linear layer that maps features to logits."""
        return self.blocks()["head"]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The head's input (B, D): every layer but the head's."""
        _, head_size = self.block_sizes[-1]
        for layer in list(self)[:-head_size]:
            x = layer(x)
        return x

    def blocks(self) -> dict[str, nn.Module]:
        """The named blocks in forward order; a block of one layer is that layer."""
        layers, blocks, start = list(self), {}, 0
        for name, size in self.block_sizes:
            blocks[name] = layers[start] if size == 1 else nn.Sequential(*layers[start : start + size])
            start += size
        return blocks


def make_norm(kind: NormKind, num_groups: int, widths: Sequence[int], model: str) -> Norm:
    """Returns the factory of the normalisation layers ``kind`` names; "none" gives identities.

    Raises:
        ValueError: GroupNorm's ``num_groups`` does not divide one of the layer ``widths``.
    """
    if kind == "batch":
        return nn.BatchNorm2d
    if kind == "none":
        return lambda channels: nn.Identity()
    for width in widths:
        if width % num_groups:
            raise ValueError(
                f"model {model!r}: num_groups {num_groups} must divide width {width}; "
                f"choose a divisor of {math.gcd(*widths)}"
            )
    return lambda channels: nn.GroupNorm(num_groups, channels)


def flat_size(convs: dict[str, list[nn.Module]], shape: tuple[int, ...], model: str) -> int:
    """Number of features the conv blocks produce for one image of ``shape``.

    Raises:
        ValueError: the image is too small for the conv and pooling layers.
    """
    probe = nn.Sequential(*(layer for block in convs.values() for layer in block))
    probe.eval()  # BatchNorm must neither learn statistics from the zeros nor need a batch of two
    try:
        with torch.no_grad():
            return probe(torch.zeros(1, *shape)).numel()
    except RuntimeError as err:
        raise ValueError(f"model {model!r}: input_shape {shape} is too small: {err}") from err
    finally:
        probe.train()


def classifier(
    convs: dict[str, list[nn.Module]],
    hidden: list[int],
    spec: DataSpec,
    model: str,
    projector: int | None = None,
) -> BlockSequential:
    """Joins the conv blocks, ReLU dense blocks "fc1", "fc2", ... of widths ``hidden`` (the first
    one flattens), and the "head", a linear classifier; without dense blocks a "flatten" block
    precedes the head.

    With a ``projector`` width, IMA's "linear projector" (one linear layer, no ReLU) is the last
    block before the head: the features are its output, as in the authors' code.
    """
    widths = [flat_size(convs, spec.input_shape, model), *hidden]
    blocks: dict[str, list[nn.Module]] = dict(convs)
    flatten: list[nn.Module] = [nn.Flatten()]
    for index, (width_in, width_out) in enumerate(zip(widths, widths[1:]), start=1):
        blocks[f"fc{index}"] = [*flatten, nn.Linear(width_in, width_out), nn.ReLU()]
        flatten = []
    if flatten:
        blocks["flatten"] = flatten
    if projector is not None:
        blocks["projector"] = [nn.Linear(widths[-1], projector)]
        widths.append(projector)
    blocks["head"] = [nn.Linear(widths[-1], spec.num_classes)]
    return BlockSequential(blocks)


@register("model", "mlp", config=MLPConfig)
def build_mlp(config: MLPConfig, spec: DataSpec) -> BlockSequential:
    """Multilayer perceptron on the flattened input: hidden ReLU layers, then logits."""
    require_classification(spec, "mlp")
    return classifier({}, list(config.hidden), spec, "mlp")


def conv_pool(channels_in: int, channels_out: int, padding: int = 0) -> list[nn.Module]:
    """A 5x5 conv, ReLU and 2x2 max-pool: one conv block of the FedAvg and IMA CNNs."""
    return [nn.Conv2d(channels_in, channels_out, 5, padding=padding), nn.ReLU(), MaxPool2d(2)]


@register("model", "cnn_mnist", config=CNNMnistConfig)
def build_cnn_mnist(config: CNNMnistConfig, spec: DataSpec) -> BlockSequential:
    """FedAvg's CNN (McMahan et al., arXiv:1602.05629): 1,663,370 params on 1x28x28, 10 classes."""
    channels, _, _ = image_shape(spec, "cnn_mnist")
    convs = {"conv1": conv_pool(channels, 32, padding=2), "conv2": conv_pool(32, 64, padding=2)}
    return classifier(convs, [512], spec, "cnn_mnist")


@register("model", "cnn_fmnist", config=CNNFmnistConfig)
def build_cnn_fmnist(config: CNNFmnistConfig, spec: DataSpec) -> BlockSequential:
    """IMA's FMNIST CNN (Zhou et al., arXiv:2305.07845): 274,026 params on 1x28x28, 10 classes."""
    channels, _, _ = image_shape(spec, "cnn_fmnist")
    convs = {"conv1": conv_pool(channels, 32), "conv2": conv_pool(32, 32)}
    return classifier(convs, [384, 128], spec, "cnn_fmnist")


@register("model", "cnn_cifar", config=CNNCifarConfig)
def build_cnn_cifar(config: CNNCifarConfig, spec: DataSpec) -> BlockSequential:
    """IMA's CIFAR CNN (Zhou et al., arXiv:2305.07845): 772,682 params on 3x32x32, 10 classes."""
    channels, _, _ = image_shape(spec, "cnn_cifar")
    convs = {"conv1": conv_pool(channels, 64), "conv2": conv_pool(64, 64)}
    return classifier(convs, [384, 128], spec, "cnn_cifar")


@register("model", "cnn_pfl", config=PflCNNConfig)
def build_cnn_pfl(config: PflCNNConfig, spec: DataSpec) -> BlockSequential:
    """pfl-research's benchmark CNN (arXiv:2404.06430): 1,626,442 params on 3x32x32, 10 classes.

    Also FedFish's EMNIST "CNN with dropout" when built for 1x28x28 and 62 classes. Blocks:
    "conv1" (conv, ReLU), "conv2" (conv, ReLU, pool), "fc1" (dropout, flatten, dense, ReLU,
    dropout) and "head".
    """
    channels, _, _ = image_shape(spec, "cnn_pfl")
    convs: dict[str, list[nn.Module]] = {
        "conv1": [nn.Conv2d(channels, 32, 3), nn.ReLU()],
        "conv2": [nn.Conv2d(32, 64, 3), nn.ReLU(), MaxPool2d(2)],
    }
    dense = [
        Dropout(config.conv_dropout),
        nn.Flatten(),
        nn.Linear(flat_size(convs, spec.input_shape, "cnn_pfl"), 128),
        nn.ReLU(),
        Dropout(config.fc_dropout),
    ]
    model = BlockSequential({**convs, "fc1": dense, "head": [nn.Linear(128, spec.num_classes)]})
    # pfl initialises weights Glorot-uniform to match its TF2 twin; biases keep torch's default.
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(module.weight)
    return model


@register("model", "simple_cnn", config=SimpleCNNConfig)
def build_simple_cnn(config: SimpleCNNConfig, spec: DataSpec) -> BlockSequential:
    """FedGuCci's CIFAR-10 SimpleCNN (Li et al., KDD 2025, arXiv:2402.18949, App. A.2).

    122,570 params on 3x32x32 with 10 classes (32 -> 30 -> 15 -> 13 -> 6 -> 4: flatten 64*4*4).
    Blocks: "conv1", "conv2" (conv 3x3, ReLU, pool), "conv3" (conv 3x3, ReLU), "fc1" and "head".
    """
    channels, _, _ = image_shape(spec, "simple_cnn")
    convs: dict[str, list[nn.Module]] = {
        "conv1": [nn.Conv2d(channels, 32, 3), nn.ReLU(), MaxPool2d(2)],
        "conv2": [nn.Conv2d(32, 64, 3), nn.ReLU(), MaxPool2d(2)],
        "conv3": [nn.Conv2d(64, 64, 3), nn.ReLU()],
    }
    return classifier(convs, [64], spec, "simple_cnn")


@register("model", "cnn_digit5", config=CNNDigit5Config)
def build_cnn_digit5(config: CNNDigit5Config, spec: DataSpec) -> BlockSequential:
    """IMA's Digit-Five CNN-GN (Zhou et al., IEEE TMC 2024, arXiv:2305.07845, Table IV).

    The authors' public code: three blocks conv 5x5 (pad 2) - GroupNorm - ReLU - max-pool of 64,
    64 and 128 channels, FC(flat, 384) - ReLU - FC(384, 128) - FC(128, C); 806,090 params on
    3x28x28 with 10 classes (28 -> 14 -> 7 -> 3: flatten 1152). The paper describes FedBN's
    DigitModel instead ("three 5x5 conv layers and five GroupNorm layers", FC(2048, 128) in its
    Table IV), which the code does not match. FC(384, 128) has no ReLU after it: it is IMA's
    linear projector, the "projector" block, and the features are its 128-d output (the code's
    FedFA anchors them); the "head" is the classifier FC(128, C) alone.
    """
    channels, _, _ = image_shape(spec, "cnn_digit5")
    norm = make_norm("group", config.num_groups, [64, 64, 128], "cnn_digit5")

    def conv_norm_pool(channels_in: int, channels_out: int) -> list[nn.Module]:
        conv = nn.Conv2d(channels_in, channels_out, 5, padding=2)
        return [conv, norm(channels_out), nn.ReLU(), MaxPool2d(2)]

    convs = {
        "conv1": conv_norm_pool(channels, 64),
        "conv2": conv_norm_pool(64, 64),
        "conv3": conv_norm_pool(64, 128),
    }
    return classifier(convs, [384], spec, "cnn_digit5", projector=128)
