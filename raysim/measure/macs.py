"""What a model costs to run: multiply-accumulates (MACs) per example of its forward pass, counted
by torch's own FLOP counter, and its number of parameters.

``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of the operators that dominate a
network (matrix products, convolutions, attention); a multiply-accumulate is two of them. Element-
wise work (activations, normalisation, pooling) is not counted, as in the papers' MAC figures.

Usage:
    cost = model_cost(model, example_x)   # one forward pass, in eval mode, without gradients
    cost.macs_per_example, cost.params
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class ModelCost:
    macs_per_example: float  # of one forward pass
    params: int  # parameters (trainable or not); buffers such as BatchNorm's statistics left out


def forward_macs(model: nn.Module, x: torch.Tensor) -> float:
    """MACs of ``model(x)`` per example of the batch ``x``, in eval mode and without gradients
    (the model's training mode is restored; its weights and buffers are left as they were)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 2 / len(x)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def model_cost(model: nn.Module, x: torch.Tensor) -> ModelCost:
    return ModelCost(forward_macs(model, x), num_parameters(model))
