"""A model run at other weights, without touching it: ``at_weights(model, weights)``.

A loss at mixed or anchor weights (FedGuCci's connectivity, LSS's soups, MOON's frozen models,
DP-SGD's per-example pass) needs the model's forward at tensors that are not its own, with
autograd reaching whatever those tensors were computed from; ``torch.func.functional_call`` runs
it so, and this wraps it as a module any ``LossFn`` accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import nn


class AtWeights(nn.Module):
    """``model`` run at other weights through ``torch.func.functional_call``: see ``at_weights``."""

    model: nn.Module

    def __init__(self, model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.__dict__["model"] = model  # a plain reference: the view owns no parameters or buffers
        self.weights = dict(weights)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.model, self.weights, inputs)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The model's ``features(x)`` (a ``raysim.types.FeatureModel``'s) at the weights."""
        return torch.func.functional_call(self._features, self._prefixed, (x,))

    @functools.cached_property
    def _features(self) -> nn.Module:
        return _Method(self.model, "features")

    @functools.cached_property
    def _prefixed(self) -> dict[str, torch.Tensor]:  # the weights as _Method's state-dict names
        return {f"model.{k}": v for k, v in self.weights.items()}


class _Method(nn.Module):
    """One method of ``model`` as a module's forward, so ``functional_call`` can run it."""

    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model = model
        self.name = name

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.name)(*inputs)


def at_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> AtWeights:
    """``model`` evaluated at ``weights`` (tensors by state-dict name) instead of its own, without
    touching it: a module whose forward (and ``features``) run ``model``'s through
    ``torch.func.functional_call``, so any ``LossFn`` can be evaluated at those weights and
    autograd reaches whatever the weights were computed from. Tensors ``weights`` leaves out are
    the model's own. The model's mode (train or eval) applies; passes that update buffers
    (BatchNorm statistics in train mode) update the tensors in ``weights`` where it has them.

    Usage:
        mixed = {k: alpha * p + (1 - alpha) * anchor[k] for k, p in model.named_parameters()}
        loss, correct, count = task_loss(at_weights(model, mixed), batch, spec)  # FedGuCci
        z_glob = at_weights(model, ctx.global_params).features(x)  # MOON's positive
    """
    return AtWeights(model, weights)
