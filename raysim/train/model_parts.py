"""A model split into a shared part the server averages and a personal part a client keeps.

FedBN keeps its BatchNorm layers, FedRep and FedBABU their head: the plugins name the personal
part by its state-dict names (``batchnorm_names``, ``head_names``), send the rest of their delta
(``without``), keep or load the personal part (``only``, ``load_part``), train with a part
frozen (``frozen``) and give the server's step a zero delta where nothing was sent
(``complete_delta``).

Usage:
    personal = batchnorm_names(ctx.model)
    load_part(ctx.model, ctx.state.layers)                     # the client's own BatchNorm
    delta = without(train_client(ctx, config.local)[0], personal)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from raysim import params as P
from raysim.types import Params, feature_model

_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def batchnorm_names(model: nn.Module) -> frozenset[str]:
    """The travelling tensors (``params.model_params``) of the model's BatchNorm layers: their
    affine weight and bias and their running statistics, whatever the layers are named."""
    travelling = P.model_params(model)
    return frozenset(
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, _BATCHNORM)
        for name, _ in module.state_dict(keep_vars=True).items()
        if (f"{prefix}.{name}" if prefix else name) in travelling
    )


def head_names(model: nn.Module, who: str) -> frozenset[str]:
    """The travelling tensors of the model's ``head`` (``raysim.types.FeatureModel``).

    Raises:
        TypeError: the model has no ``features`` and ``head``; names ``who``.
    """
    head = feature_model(model, who).head
    own = {id(t) for t in head.state_dict(keep_vars=True).values()}
    return frozenset(name for name, t in model.state_dict(keep_vars=True).items() if id(t) in own) & set(
        P.model_params(model)
    )


def only(params: Params, names: Collection[str]) -> Params:
    """The entries of ``params`` named in ``names``."""
    return {k: v for k, v in params.items() if k in names}


def without(params: Params, names: Collection[str]) -> Params:
    """The entries of ``params`` not named in ``names``."""
    return {k: v for k, v in params.items() if k not in names}


@torch.no_grad()
def load_part(model: nn.Module, part: Mapping[str, torch.Tensor]) -> None:
    """Copies ``part`` (some of the model's state-dict entries) into the model in place.

    Raises:
        KeyError: an entry the model does not have.
    """
    own = model.state_dict()
    unknown = set(part) - set(own)
    if unknown:
        raise KeyError(f"not in the model: {sorted(unknown)[:5]}")
    for name, value in part.items():
        own[name].copy_(value)


def split_parameters(model: nn.Module, part: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The parameters of ``part`` (a submodule, such as the head) and those of the rest of ``model``."""
    own = {id(p) for p in part.parameters()}
    rest = [p for p in model.parameters() if id(p) not in own]
    return list(part.parameters()), rest


@contextmanager
def frozen(params: Iterable[nn.Parameter]) -> Iterator[None]:
    """``params`` do not train inside the block (``make_optimizer`` skips them, no gradient
    reaches them); their ``requires_grad`` flags are restored after it."""
    params = list(params)
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


def complete_delta(mean_delta: Params | None, params: Params) -> Params | None:
    """The mean delta of the shared part, with a zero delta for every personal entry of
    ``params`` (the server keeps those as they were); None stays None (nobody reported)."""
    if mean_delta is None:
        return None
    return {k: mean_delta[k] if k in mean_delta else torch.zeros_like(w) for k, w in params.items()}
