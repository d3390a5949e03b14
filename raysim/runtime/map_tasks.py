"""What a worker computes for a ``map_clients`` request: for each unit, a parameter point on one
unit of data (a client's split, a round's batch, the central test set), its loss and accuracy, or
its outputs, features, labels or inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

from raysim import params as P
from raysim.measure.evaluate import evaluate
from raysim.services import MapRequest, MapTask
from raysim.train.batching import iterate_batches, to_tensors
from raysim.types import ClientData, DataSpec

if TYPE_CHECKING:
    from raysim.models.anatomy import FeatureModel

R = TypeVar("R")  # one ``map_clients`` result


def map_units(
    request: MapRequest[R],
    units: list[tuple[int, int]],
    model: nn.Module,
    data_of: Callable[[int], ClientData | None],
    spec: DataSpec,
    device: torch.device,
    batch_size: int,
) -> list[R | None]:
    """``request.task`` for each (point index, client position) unit, in order, on ``model``; the
    data of a position is ``data_of(position)`` (None or empty: no result).

    Units arrive grouped by point, so each point is loaded into the model once.
    """
    out: list[R | None] = []
    loaded = None
    for point, position in units:
        if point != loaded:
            weights = request.points[point]
            P.load_into(model, {k: torch.as_tensor(v).to(device) for k, v in weights.items()})
            loaded = point
        data = data_of(position)
        out.append(
            compute_task(request.task, model, data, spec, device, batch_size)
            if data is not None and len(data)
            else None
        )
    return out


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
