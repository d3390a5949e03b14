"""Small image classifiers: an MLP and the CNNs of FedAvg, IMA and pfl-research.

Every model takes float32 images (B, C, H, W) and returns logits (B, num_classes). Flatten sizes
come from a dummy forward at build time, so the CNNs accept any image large enough for their convs
(28x28, 32x32, and for ``cnn_mnist`` even the 8x8 sklearn digits).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field, PositiveInt
from torch import nn

from raysim.registry import register
from raysim.types import DataSpec

# The registry shows each Config's first docstring line as its model's summary.


class MLPConfig(BaseModel, frozen=True, extra="forbid"):
    """Multilayer perceptron on the flattened input: ReLU hidden layers, then logits."""

    hidden: tuple[PositiveInt, ...] = (200, 200)  # hidden widths; () gives logistic regression


class CNNMnistConfig(BaseModel, frozen=True, extra="forbid"):
    """FedAvg's MNIST CNN (McMahan et al., arXiv:1602.05629): 2 conv 5x5, FC 512; no options."""


class CNNFmnistConfig(BaseModel, frozen=True, extra="forbid"):
    """IMA's FMNIST CNN (arXiv:2305.07845): 2 conv 5x5 of 32, FC 384 and 128; no options."""


class CNNCifarConfig(BaseModel, frozen=True, extra="forbid"):
    """IMA's CIFAR CNN (arXiv:2305.07845): 2 conv 5x5 of 64, FC 384 and 128; no options."""


class PflCNNConfig(BaseModel, frozen=True, extra="forbid"):
    """pfl-research's benchmark CNN (arXiv:2404.06430): 2 conv 3x3, FC 128, with dropout."""

    conv_dropout: float = Field(0.25, ge=0.0, lt=1.0)  # after the max-pool
    fc_dropout: float = Field(0.5, ge=0.0, lt=1.0)  # after the hidden dense layer


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


def flat_size(features: list[nn.Module], shape: tuple[int, ...], model: str) -> int:
    """Number of features ``features`` produce for one image of ``shape``.

    Raises:
        ValueError: the image is too small for the conv and pooling layers.
    """
    try:
        with torch.no_grad():
            return nn.Sequential(*features)(torch.zeros(1, *shape)).numel()
    except RuntimeError as err:
        raise ValueError(f"model {model!r}: input_shape {shape} is too small: {err}") from err


def classifier(features: list[nn.Module], hidden: list[int], spec: DataSpec, model: str) -> nn.Sequential:
    """Joins ``features``, a flatten, ReLU dense layers of widths ``hidden``, and the logits."""
    widths = [flat_size(features, spec.input_shape, model), *hidden]
    layers = [*features, nn.Flatten()]
    for width_in, width_out in zip(widths, widths[1:]):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], spec.num_classes))


@register("model", "mlp", config=MLPConfig)
def build_mlp(config: MLPConfig, spec: DataSpec) -> nn.Sequential:
    """Multilayer perceptron on the flattened input: hidden ReLU layers, then logits."""
    require_classification(spec, "mlp")
    return classifier([], list(config.hidden), spec, "mlp")


@register("model", "cnn_mnist", config=CNNMnistConfig)
def build_cnn_mnist(config: CNNMnistConfig, spec: DataSpec) -> nn.Sequential:
    """FedAvg's CNN (McMahan et al., arXiv:1602.05629): 1,663,370 params on 1x28x28, 10 classes."""
    channels, _, _ = image_shape(spec, "cnn_mnist")
    features = [
        nn.Conv2d(channels, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
    ]
    return classifier(features, [512], spec, "cnn_mnist")


@register("model", "cnn_fmnist", config=CNNFmnistConfig)
def build_cnn_fmnist(config: CNNFmnistConfig, spec: DataSpec) -> nn.Sequential:
    """IMA's FMNIST CNN (Zhou et al., arXiv:2305.07845): 274,026 params on 1x28x28, 10 classes."""
    channels, _, _ = image_shape(spec, "cnn_fmnist")
    features = [
        nn.Conv2d(channels, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
    ]
    return classifier(features, [384, 128], spec, "cnn_fmnist")


@register("model", "cnn_cifar", config=CNNCifarConfig)
def build_cnn_cifar(config: CNNCifarConfig, spec: DataSpec) -> nn.Sequential:
    """IMA's CIFAR CNN (Zhou et al., arXiv:2305.07845): 772,682 params on 3x32x32, 10 classes."""
    channels, _, _ = image_shape(spec, "cnn_cifar")
    features = [
        nn.Conv2d(channels, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
    ]
    return classifier(features, [384, 128], spec, "cnn_cifar")


@register("model", "cnn_pfl", config=PflCNNConfig)
def build_cnn_pfl(config: PflCNNConfig, spec: DataSpec) -> nn.Sequential:
    """pfl-research's benchmark CNN (arXiv:2404.06430): 1,626,442 params on 3x32x32, 10 classes.

    Also FedFish's EMNIST "CNN with dropout" when built for 1x28x28 and 62 classes.
    """
    channels, _, _ = image_shape(spec, "cnn_pfl")
    features = [
        nn.Conv2d(channels, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
    ]
    head = [
        nn.Dropout(config.conv_dropout),
        nn.Flatten(),
        nn.Linear(flat_size(features, spec.input_shape, "cnn_pfl"), 128),
        nn.ReLU(),
        nn.Dropout(config.fc_dropout),
        nn.Linear(128, spec.num_classes),
    ]
    model = nn.Sequential(*features, *head)
    # pfl initialises weights Glorot-uniform to match its TF2 twin; biases keep torch's default.
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(module.weight)
    return model
