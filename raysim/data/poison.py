"""A backdoor on chosen clients' training images, and the triggered test set that measures it.

FuseFL's shapes (Sec. 3.3 and D.5 of the paper, Tang et al., NeurIPS 2024, arXiv:2410.20380): a square
patch of ``trigger_size`` pixels holds one of ten shapes chosen by a label index, filled with one
of ten colours, at a uniformly random position. ``dataset.poison`` (``PoisonConfig``) stamps it on
a fraction of each training batch of the poisoned clients, after augmentation; with a ``target``
it is the target's shape and the labels become the target (a backdoor attack), without one each
image gets its own label's shape and keeps its label (FuseFL's spurious feature).

The attack success rate is the accuracy on ``triggered_test``: the central test images whose label
is not the shape's label, stamped with it and labelled with it, so that a prediction is "correct"
exactly when the trigger decided it.

Usage:
    batch = poison_batch(batch, config, generator, pixels)   # a poisoned client's batch
    asr = evaluate(model, triggered_test(test, config, seed, pixels, num_classes), spec)["accuracy"]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from matplotlib.path import Path

from raysim.config.sections import PoisonConfig
from raysim.types import ClientData

Batch = dict[str, torch.Tensor]
Pixels = Callable[[torch.Tensor], torch.Tensor]  # (n, C) colours on [0, 1] -> the images' scale

SHAPES = (
    "circle", "triangle", "square", "ellipse", "star", "diamond", "heart", "cross", "pentagon", "hexagon"
)  # fmt: skip
# FuseFL's colours, as PIL names them (RGB on [0, 255]); grey images take PIL's luma of each.
PALETTE = np.array(
    [[255, 0, 0], [0, 0, 255], [0, 128, 0], [255, 255, 0], [128, 0, 128],
     [255, 165, 0], [255, 192, 203], [165, 42, 42], [0, 0, 0], [128, 128, 128]], dtype=np.float64,
)  # fmt: skip
LUMA = np.array([0.299, 0.587, 0.114])


def _polygon(corners: int, radius: np.ndarray | float = 1.0) -> np.ndarray:
    """Vertices of a regular polygon (or star, with alternating radii), first vertex up."""
    angles = -np.pi / 2 + np.arange(corners) * 2 * np.pi / corners
    return np.stack([radius * np.cos(angles), radius * np.sin(angles)], axis=1)


def shape_masks(size: int) -> torch.Tensor:
    """(10, size, size) bool: the shapes of ``SHAPES`` at pixel centres, x right and y down."""
    centres = (np.arange(size) + 0.5) * 2 / size - 1
    v, u = np.meshgrid(centres, centres, indexing="ij")  # v down the rows, u along them
    points = np.stack([u.ravel(), v.ravel()], axis=1)

    def inside(vertices: np.ndarray) -> np.ndarray:
        return Path(vertices).contains_points(points, radius=1e-9).reshape(size, size)

    hx, hy = 1.15 * u, 0.125 - 1.125 * v  # the heart's curve, y up, fills the patch: (x² + y² - 1)³ <= x² y³
    masks = [
        u**2 + v**2 <= 1,
        inside(np.array([[0.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])),
        np.ones((size, size), bool),
        u**2 + (v / 0.6) ** 2 <= 1,
        inside(_polygon(10, np.tile([1.0, 0.45], 5))),
        np.abs(u) + np.abs(v) <= 1,
        (hx**2 + hy**2 - 1) ** 3 - hx**2 * hy**3 <= 0,
        (np.abs(u) <= 1 / 3) | (np.abs(v) <= 1 / 3),
        inside(_polygon(5)),
        inside(_polygon(6)),
    ]
    return torch.from_numpy(np.stack(masks))


def palette(channels: int) -> torch.Tensor:
    """(10, channels) colours on [0, 1]: RGB for 3 channels, their luma for 1."""
    colours = PALETTE @ LUMA[:, None] if channels == 1 else PALETTE
    return torch.from_numpy(colours / 255).float()


def stamp(
    x: torch.Tensor, shape_labels: torch.Tensor, size: int, generator: torch.Generator, pixels: Pixels
) -> torch.Tensor:
    """``x`` (n, C, H, W) with shape ``shape_labels % 10`` of ``size`` drawn on each image, in a
    random colour at a random position; draws the rows' tops, lefts, then colours."""
    n, channels, height, width = x.shape
    top = torch.randint(0, height - size + 1, (n,), generator=generator)
    left = torch.randint(0, width - size + 1, (n,), generator=generator)
    colour = pixels(palette(channels)[torch.randint(0, len(PALETTE), (n,), generator=generator)])
    offsets = torch.arange(size)
    covered = torch.zeros(n, height, width, dtype=torch.bool)
    rows, cols = (top[:, None] + offsets)[:, :, None], (left[:, None] + offsets)[:, None, :]
    covered[torch.arange(n)[:, None, None], rows, cols] = shape_masks(size)[shape_labels.cpu() % len(SHAPES)]
    covered, colour = covered.to(x.device), colour.to(x.device, x.dtype)
    return torch.where(covered[:, None], colour[:, :, None, None], x)


def poison_batch(batch: Batch, config: PoisonConfig, generator: torch.Generator, pixels: Pixels) -> Batch:
    """The batch with ``config.fraction`` of its images (a seeded choice) carrying the trigger."""
    x, y = batch["x"], batch["y"]
    count = int(round(config.fraction * len(y)))
    rows = torch.randperm(len(y), generator=generator)[:count].to(y.device)
    labels = y[rows] if config.target is None else torch.full_like(y[rows], config.target)
    x, y = x.clone(), y.clone()
    x[rows] = stamp(x[rows], labels, config.trigger_size, generator, pixels)
    y[rows] = labels
    return {**batch, "x": x, "y": y}


def triggered_test(
    data: ClientData, config: PoisonConfig, seed: int, pixels: Pixels, num_classes: int
) -> ClientData:
    """The test images whose label is not their trigger's, stamped and labelled with the trigger's
    label: the target, or (without one) another label drawn per image."""
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.from_numpy(data.arrays["x"]), torch.from_numpy(data.arrays["y"])
    if config.target is None:  # another label than the image's own, uniformly
        shape_labels = (y + torch.randint(1, num_classes, y.shape, generator=generator)) % num_classes
    else:
        shape_labels = torch.full_like(y, config.target)
    keep = y != shape_labels
    stamped = stamp(x[keep], shape_labels[keep], config.trigger_size, generator, pixels)
    return ClientData({"x": stamped.numpy(), "y": shape_labels[keep].numpy()})
