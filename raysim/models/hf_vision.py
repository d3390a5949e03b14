"""``hf_resnet`` and ``hf_vit``: HuggingFace ResNet-18/50 and ViT-B/16 image classifiers.

Built from scratch for the data, or loaded from ``pretrained_path``: a ``save_pretrained``
directory (a classifier, or a bare ``ResNetModel`` / ``ViTModel`` backbone), or a hub id such as
"microsoft/resnet-50" or "google/vit-base-patch16-224", which transformers downloads when online
and reads from its cache when ``HF_HUB_OFFLINE`` is set. The head is replaced for the job's
classes: a saved head with another class count (ImageNet's 1,000) or none at all becomes a fresh
linear layer drawn from the seeded generator, so every process draws the same one. A saved head
with the job's class count is kept (a fine-tuned classifier resumes as it was).

A pretrained model must fit the job: its architecture the model's, its channels the data's (RGB
backbones read 3 channels: ``dataset.mode: RGB`` replicates greyscale), and a ViT's image size the
data's (``dataset.resize: [224, 224]`` in ``hf_images``). Each mismatch is one ``ConfigError``
raised when the driver builds the model, before any worker starts, naming the key and the fix.

With a ``lora`` section the backbone is frozen and LoRA adapters (peft) train with the fresh head,
as for the text models (``lora.py``): ``raysim.params.model_params`` sends trainable tensors and
float buffers only, so a ViT's clients exchange adapters and head alone, and a ResNet's also its
BatchNorm running statistics (float buffers that training updates: about 9,600 values on
ResNet-18, against 11 million parameters).

Anatomy (``anatomy.py``): ``features(x)`` is what the HF head reads, the pooled (B, C) map of the
last ResNet stage or the ViT's normalised class token (B, D); ``head`` is ``classifier``.

Usage:
    spec = DataSpec("classification", (3, 224, 224), 10)
    model = build_model("hf_vit", {"pretrained_path": "vit-b16/", "lora": {}}, spec)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch import nn

from raysim.errors import ConfigError
from raysim.models.lora import ClassifierLoraConfig, apply_lora
from raysim.models.vision import image_shape
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# transformers' model_type of each registered model.
MODEL_TYPES = {"hf_resnet": "resnet", "hf_vit": "vit"}


@dataclass(frozen=True)
class ResNetSizes:
    """A ResNet's residual blocks: their kind, how many per stage and each stage's width."""

    layer_type: Literal["basic", "bottleneck"]
    depths: tuple[int, ...]
    hidden_sizes: tuple[int, ...]


# ResNet-18: 2 basic blocks (2 convs each) per stage; ResNet-50: bottlenecks (3 convs) 3, 4, 6, 3.
RESNETS = {
    18: ResNetSizes("basic", (2, 2, 2, 2), (64, 128, 256, 512)),
    50: ResNetSizes("bottleneck", (3, 4, 6, 3), (256, 512, 1024, 2048)),
}


class HFResNetConfig(ModelConfig, frozen=True, extra="forbid"):
    """HuggingFace ResNet-18 or -50 (He et al., arXiv:1512.03385), from scratch or pretrained.

    ``depth`` None builds a ResNet-18 from scratch and takes a pretrained directory's own depth;
    set beside ``pretrained_path``, the directory must hold that depth.
    """

    depth: Literal[18, 50] | None = None
    pretrained_path: str | None = None  # a save_pretrained directory or a hub id
    lora: ClassifierLoraConfig | None = None  # train LoRA adapters (and the head) only


class HFViTConfig(ModelConfig, frozen=True, extra="forbid"):
    """HuggingFace ViT-B/16 (Dosovitskiy et al., arXiv:2010.11929), from scratch or pretrained."""

    pretrained_path: str | None = None  # a save_pretrained directory or a hub id
    lora: ClassifierLoraConfig | None = None  # train LoRA adapters (and the head) only


class HFImageModel(nn.Module):
    """Runs a HuggingFace image classifier on images (B, C, H, W) and returns logits (B, classes).

    Attributes:
        hf: the transformers model, or the ``peft.PeftModel`` around it under LoRA.
    """

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hf(pixel_values=x).logits

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The head's input (B, D): as the HF classifier's own forward computes it."""
        inner = self.unwrapped()
        output = inner.base_model(pixel_values=x)
        if inner.config.model_type == "vit":
            return output.last_hidden_state[:, 0]  # the class token, after the final LayerNorm
        return output.pooler_output.flatten(1)  # (B, C, 1, 1) -> (B, C), the head's Flatten

    @property
    def head(self) -> nn.Module:
        """The classifier (under LoRA, peft's trained copy of it)."""
        return cast(nn.Module, self.unwrapped().classifier)

    def unwrapped(self) -> PreTrainedModel:
        """The transformers model: ``hf``, or the model inside peft's wrapper."""
        get_base_model = getattr(self.hf, "get_base_model", None)
        return cast("PreTrainedModel", get_base_model() if get_base_model is not None else self.hf)


@register("model", "hf_resnet", config=HFResNetConfig)
def build_hf_resnet(config: HFResNetConfig, spec: DataSpec) -> HFImageModel:
    """HuggingFace ResNet-18/50 image classifier (``ResNetForImageClassification``)."""
    from transformers import ResNetConfig

    channels, _, _ = image_shape(spec, "hf_resnet")
    if config.pretrained_path is None:
        sizes = RESNETS[config.depth or 18]
        scratch = ResNetConfig(
            num_channels=channels,
            layer_type=sizes.layer_type,
            depths=list(sizes.depths),
            hidden_sizes=list(sizes.hidden_sizes),
        )
        return finish(from_config(scratch, spec), config.lora)
    hf_config = pretrained_config(config.pretrained_path, "hf_resnet", spec)
    depth = resnet_depth(hf_config)
    if config.depth is not None and config.depth != depth:
        raise ConfigError(
            [
                f"model.depth: {config.depth}, but model.pretrained_path {config.pretrained_path!r} "
                f"holds a ResNet-{depth}; set model.depth={depth}, unset it, or give a ResNet-"
                f"{config.depth} directory"
            ]
        )
    return finish(load_pretrained(config.pretrained_path, hf_config), config.lora)


@register("model", "hf_vit", config=HFViTConfig)
def build_hf_vit(config: HFViTConfig, spec: DataSpec) -> HFImageModel:
    """HuggingFace ViT-B/16 image classifier (``ViTForImageClassification``)."""
    from transformers import ViTConfig

    channels, height, width = image_shape(spec, "hf_vit")
    if config.pretrained_path is None:
        if height != width:
            raise ValueError(f"model 'hf_vit' takes square images, got {height}x{width}; set dataset.resize")
        # ViTConfig's defaults are ViT-B/16: 12 layers of width 768, 12 heads, 16x16 patches.
        scratch = ViTConfig(image_size=height, num_channels=channels)
        return finish(from_config(scratch, spec), config.lora)
    hf_config = pretrained_config(config.pretrained_path, "hf_vit", spec)
    size = hf_config.image_size
    expected = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    if expected != (height, width):
        raise ConfigError(
            [
                f"model.pretrained_path: {config.pretrained_path!r} takes {expected[0]}x{expected[1]} "
                f"images, the data's are {height}x{width}; set dataset.resize: [{expected[0]}, "
                f"{expected[1]}] (hf_images)"
            ]
        )
    return finish(load_pretrained(config.pretrained_path, hf_config), config.lora)


def resnet_depth(hf_config: PretrainedConfig) -> int:
    """A ResNet's depth: its convolutions plus the stem and the classifier (18, 50, ...)."""
    convs_per_block = 2 if hf_config.layer_type == "basic" else 3
    return convs_per_block * sum(hf_config.depths) + 2


def pretrained_config(path: str, model: str, spec: DataSpec) -> PretrainedConfig:
    """The transformers config at ``path``, checked against the model and data, set for the job's classes.

    Raises:
        ConfigError: ``path`` cannot be read, holds another architecture, or reads images with
            another number of channels than the data's.
    """
    from transformers import AutoConfig

    kind = MODEL_TYPES[model]
    saved_type = saved_model_type(path)
    if saved_type is not None and saved_type != kind:
        other = {v: k for k, v in MODEL_TYPES.items()}.get(saved_type)
        fix = f"use model name {other}" if other else f"give a {kind} directory"
        raise ConfigError(
            [f"model.pretrained_path: {path!r} holds a {saved_type!r} model, not {model}'s {kind!r}; {fix}"]
        )
    hf_config = from_hub_or_directory(AutoConfig.from_pretrained, path)
    channels = spec.input_shape[0]
    if hf_config.num_channels != channels:
        raise ConfigError(
            [
                f"model.pretrained_path: {path!r} reads {hf_config.num_channels}-channel images, the "
                f"data has {channels}; set dataset.mode: {'RGB' if hf_config.num_channels == 3 else 'L'}"
                " (hf_images), or give a model of the data's channels"
            ]
        )
    hf_config.num_labels = spec.num_classes  # a saved head of another size is replaced
    return hf_config


def saved_model_type(path: str) -> str | None:
    """The ``model_type`` in a local directory's config.json; None for a hub id.

    Raises:
        ConfigError: a local directory without a readable config.json.
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        return None
    try:
        return str(json.loads((directory / "config.json").read_text())["model_type"])
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            [
                f"model.pretrained_path: {path!r} has no config.json with a model_type ({exc}); "
                "give a directory written by save_pretrained"
            ]
        ) from exc


def load_pretrained(path: str, hf_config: PretrainedConfig) -> PreTrainedModel:
    """The classifier at ``path`` in float32, its head fresh where its size differs from the config's."""
    from transformers import AutoModelForImageClassification

    return from_hub_or_directory(
        AutoModelForImageClassification.from_pretrained,
        path,
        config=hf_config,
        ignore_mismatched_sizes=True,  # a head for other classes gets a fresh one
        dtype=torch.float32,  # transformers 5 would keep a bf16 checkpoint in bf16
    )


def from_hub_or_directory(load: Any, path: str, **kwargs: Any) -> Any:
    """``load(path, **kwargs)`` from a local directory, else the hub (its cache when offline).

    Raises:
        ConfigError: neither a directory nor a model the hub (or its cache) has.
    """
    from huggingface_hub import constants

    directory = Path(path).expanduser()
    if directory.is_dir():
        return load(directory, local_files_only=True, **kwargs)
    try:
        return load(path, local_files_only=bool(constants.HF_HUB_OFFLINE), **kwargs)
    except OSError as exc:  # transformers' error for a repo it cannot find, online or cached
        online = (
            "unset HF_HUB_OFFLINE on a machine with network once (the cache then serves offline runs)"
            if constants.HF_HUB_OFFLINE
            else "check the hub id"
        )
        raise ConfigError(
            [
                f"model.pretrained_path: {path!r} is not a local directory and the HuggingFace hub "
                f"cannot give it ({type(exc).__name__}); give a save_pretrained directory, or {online}"
            ]
        ) from exc


def from_config(hf_config: PretrainedConfig, spec: DataSpec) -> PreTrainedModel:
    """A freshly initialised classifier of ``hf_config``'s architecture for the data's classes."""
    from transformers import AutoModelForImageClassification

    hf_config.num_labels = spec.num_classes
    return AutoModelForImageClassification.from_config(hf_config)


def finish(hf: PreTrainedModel, lora: ClassifierLoraConfig | None) -> HFImageModel:
    """Wraps ``hf``, with LoRA adapters when asked."""
    return HFImageModel(hf if lora is None else apply_lora(hf, lora))
