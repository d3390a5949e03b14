"""What a worker computes for a ``map_clients`` request on one unit of data (a client's split, a
round's batch, the central test set): its loss and accuracy, or its outputs, features, labels or inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from raysim.measure.evaluate import evaluate
from raysim.services import MapTask
from raysim.train.local import iterate_batches, to_tensors
from raysim.types import ClientData, DataSpec

if TYPE_CHECKING:
    from raysim.models.anatomy import FeatureModel


@torch.no_grad()
def compute_task(
    task: MapTask[Any],
    model: nn.Module,
    data: ClientData,
    spec: DataSpec,
    device: torch.device,
    batch_size: int,
) -> Any:
    """Loss and accuracy, or the model's outputs / ``features`` / the labels / the inputs of every
    example, in order.

    Returns:
        The task's ``R`` (Metrics for EVALUATE, an array otherwise); typed Any because mypy cannot
        tie a branch on ``task.name`` to ``R``, and the Ray path returns Any from ``ray.get`` anyway.
    """
    if task.name == "evaluate":
        return evaluate(model, data, spec, device, batch_size)
    if task.name == "labels":
        if "y" not in data.arrays:
            raise ValueError("map_clients labels: this dataset's examples have no labels ('y')")
        return np.asarray(data.arrays["y"])
    if task.name == "inputs":
        return np.asarray(data.arrays["x"])
    model.eval()
    forward = cast("FeatureModel", model).features if task.name == "features" else model  # models/ anatomy
    outputs = [
        forward(batch["x"]).float().cpu() for batch in iterate_batches(to_tensors(data, device), batch_size)
    ]
    return torch.cat(outputs).numpy()
