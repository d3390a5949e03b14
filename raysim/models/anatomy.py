"""Model anatomy: a feature extractor and a head, and for layered models, named blocks.

Every built-in model is a ``FeatureModel`` (defined in ``raysim.types`` for plugins, re-exported
here): ``features(x)`` is the penultimate representation and ``head`` the module that maps it to
logits, with ``model(x) == model.head(model.features(x))`` bitwise. MOON, FedRoD, FedFA and CCVR
work on features; FedRep and FedBABU train or average the head apart from the body. The CNNs, the
MLP and the ResNets are also ``BlockModel``s: ``blocks()`` lists named blocks whose composition is
the model, the last one being the head, so that FuseFL can split at a block and freeze what lies
below.

Only tensors travel between clients and server, so plugins select them by state-dict name:
``param_groups`` says which names belong to which block (or to the body and the head).

Usage:
    logits = model.head(model.features(x))  # == model(x); features (B, D)
    head_names = param_groups(model)["head"]  # e.g. ["head.weight", "head.bias"]
    lower, upper = split_blocks(model, "layer2")  # block names up to the end of stage 2, and the rest
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from raysim.errors import ConfigError
from raysim.types import FeatureModel

__all__ = ["BlockModel", "FeatureModel", "GlobalAvgPool", "param_groups", "parts", "split_blocks"]


@runtime_checkable
class BlockModel(FeatureModel, Protocol):
    """A feature model made of named blocks applied one after another."""

    def blocks(self) -> dict[str, nn.Module]:
        """The blocks in forward order; applied in turn they are the model, and the last is ``head``."""
        ...


class GlobalAvgPool(nn.Module):
    """Averages feature maps (B, C, H, W) over their spatial dimensions to (B, C)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def parts(model: FeatureModel) -> dict[str, nn.Module]:
    """The model's blocks, or for a model without blocks its ``body`` (all of it) and ``head``."""
    # Not isinstance(model, BlockModel): on Python 3.11 that evaluates the ``head`` property.
    if callable(getattr(model, "blocks", None)):
        return model.blocks()  # type: ignore[attr-defined]
    return {"body": model, "head": model.head}  # type: ignore[dict-item]


def param_groups(model: FeatureModel) -> dict[str, list[str]]:
    """The model's state-dict names grouped by block (or into ``body`` and ``head``), in order.

    Every name appears in exactly one group. A tensor that several groups use (GPT-2 and the
    Llama presets tie the LM head to the token embedding) belongs to the last of them: a tied
    head's group holds the embedding's name too. Groups of blocks without tensors are empty.

    Raises:
        ValueError: a tensor of the model belongs to none of its blocks (a ``blocks()`` that
            leaves part of the model out).
    """
    owner: dict[int, str] = {}
    groups: dict[str, list[str]] = {}
    for name, part in parts(model).items():
        groups[name] = []
        for tensor in part.state_dict(keep_vars=True).values():
            owner[id(tensor)] = name  # later groups win
    orphans = []
    for key, tensor in model.state_dict(keep_vars=True).items():  # type: ignore[attr-defined]
        if id(tensor) in owner:
            groups[owner[id(tensor)]].append(key)
        else:
            orphans.append(key)
    if orphans:
        raise ValueError(f"{type(model).__name__}.blocks() leaves out tensors {orphans[:5]}")
    return groups


def split_blocks(model: FeatureModel, point: str) -> tuple[list[str], list[str]]:
    """Names of the blocks up to and including ``point``, and of the blocks after it.

    ``point`` is a block name or a stage: "layer2" ends after the last "layer2.*" block, so the
    same split point serves ResNet-10, -18 and -26. Modules and tensor names follow from the
    block names: ``model.blocks()[name]`` and ``param_groups(model)[name]``.

    Raises:
        ConfigError: ``point`` names no block, or the last one (nothing would lie above it).
    """
    names = list(parts(model))
    matches = [i for i, name in enumerate(names) if name == point or name.startswith(f"{point}.")]
    if not matches or matches[-1] == len(names) - 1:
        stages = sorted({name.split(".")[0] for name in names[:-1]} - set(names[:-1]))
        raise ConfigError(
            [
                f"split point {point!r}: not a block this model can be split after; choose a "
                f"block of {names[:-1]} or a stage of {stages}"
            ]
        )
    cut = matches[-1] + 1
    return names[:cut], names[cut:]
