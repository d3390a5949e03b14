"""The model zoo: every model registers itself as ``("model", name)`` when its module is imported.

A model factory is called as ``factory(config, spec) -> nn.Module``, its Config subclassing
``ModelConfig`` (which adds ``init_from``, see ``weights.py``). Every model's ``forward(x)`` takes
one tensor: images (B, *input_shape) float32 or token ids (B, T) int64 for classification,
returning logits (B, num_classes); token ids (B, T) for causal LM, returning logits (B, T, vocab).
Every built-in model also exposes ``features(x)`` and ``head``, and the CNNs, the MLP and the
ResNets named ``blocks()`` (see ``anatomy.py``).

Usage:
    spec = DataSpec("classification", (1, 28, 28), 10)
    model = build_model("cnn_mnist", {}, spec)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from torch import nn

from raysim import registry
from raysim.errors import CheckpointError, ConfigError
from raysim.models import classic, fused, hf_causal_lm, hf_classifier, hf_vision, resnet, vision  # noqa: F401  (imported to run their @register)
from raysim.models.anatomy import BlockModel, FeatureModel, param_groups, split_blocks
from raysim.models.weights import InitFromConfig, ModelConfig, load_weights
from raysim.params import load_into
from raysim.registry import plugin_config
from raysim.types import DataSpec

__all__ = [
    "BlockModel",
    "FeatureModel",
    "InitFromConfig",
    "ModelConfig",
    "build_model",
    "build_with_params",
    "load_weights",
    "param_groups",
    "split_blocks",
]


def build_model(name: str, options: Mapping[str, Any] | BaseModel, spec: DataSpec) -> nn.Module:
    """Builds the registered model ``name`` for data described by ``spec``.

    Seed torch (``torch.manual_seed``) first: construction then gives the same weights every time.

    Args:
        name: registered model name, e.g. "cnn_mnist".
        options: the model's options, as its Config or as a dict (a "name" key is ignored, so
            a job's whole ``model:`` section can be passed).
        spec: what the data looks like.

    Returns:
        The model, in training mode, on the CPU, with the weights of ``init_from`` if set.

    Raises:
        ConfigError: unknown name or invalid options, each problem with its ``model.`` key, or
            an ``init_from`` file that cannot be read or does not fit the model.
        ValueError: the model cannot handle ``spec``.
    """
    entry = registry.get("model", name)
    if isinstance(options, BaseModel):
        if not isinstance(options, entry.config):
            raise TypeError(f"model {name!r} takes {entry.config.__name__}, got {type(options)}")
        config = options
    else:
        config = validate_options(entry.config, options)
    assert isinstance(config, ModelConfig)  # registry.register refuses other model Configs
    model = entry.factory(config, spec)
    init = config.init_from
    if init is not None:
        try:
            load_weights(model, init.path, strip_prefix=init.strip_prefix, skip=init.skip)
        except CheckpointError as exc:
            raise ConfigError([f"model.init_from: {exc}"]) from exc
    return model


def build_with_params(section: Mapping[str, Any], spec: DataSpec, params: Mapping[str, Any]) -> nn.Module:
    """A job's ``model:`` section built (``build_model``) and loaded with ``params`` (every tensor
    that travels: parameters and float buffers), e.g. a client's model on the driver (FedDF, DENSE)."""
    model = build_model(str(section["name"]), section, spec)
    load_into(model, dict(params))
    return model


def validate_options(config: type[BaseModel], options: Mapping[str, Any]) -> BaseModel:
    """Validates a dict of options into ``config``, reporting every problem at once.

    Raises:
        ConfigError: each invalid or unknown option, with its dotted key under ``model.``.
    """
    try:
        return plugin_config(config, {k: v for k, v in options.items() if k != "name"})
    except ValidationError as err:
        problems = [
            f"model.{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
            for problem in err.errors()
        ]
        raise ConfigError(problems) from None
