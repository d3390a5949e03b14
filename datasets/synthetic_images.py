"""Seeded random images for benchmarks (pfl-research's CIFAR-10 shape by default).

Each class has a fixed random template; an example is its class template averaged with fresh
uniform noise, so a model can learn the task and accuracy curves mean something. Everything is a
function of ``seed``: the same config always gives the same bytes.

Usage:
    store = open_dataset("synthetic_images", SyntheticImagesConfig(num_examples=50_000))
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, PositiveInt

from raysim.data.store import DatasetConfig, Examples, channel_stats, image_table
from raysim.registry import register
from raysim.types import DataSpec


class SyntheticImagesConfig(DatasetConfig, frozen=True, extra="forbid"):
    """Synthetic image settings.

    Attributes:
        num_examples: images partitioned into clients.
        shape: (channels, height, width) of one image.
        num_classes: number of labels.
        central_test_size: extra images drawn the same way for the central test set (0: none).
    """

    num_examples: PositiveInt = 50_000
    shape: tuple[PositiveInt, PositiveInt, PositiveInt] = (3, 32, 32)
    num_classes: PositiveInt = 10
    central_test_size: int = Field(0, ge=0)


@register("dataset", "synthetic_images")
class SyntheticImages:
    """Seeded random uint8 images with a learnable per-class template."""

    Config = SyntheticImagesConfig

    def __init__(self, config: SyntheticImagesConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Draws the images; the same seed gives the same bytes."""
        cfg = self.config
        rng = np.random.default_rng(cfg.seed)
        templates = rng.integers(0, 256, size=(cfg.num_classes, *cfg.shape), dtype=np.uint8)
        images, labels = _draw(rng, templates, cfg.num_examples)
        central = None
        if cfg.central_test_size:
            central = image_table(*_draw(rng, templates, cfg.central_test_size))
        mean, std = channel_stats(images)
        return Examples(
            table=image_table(images, labels),
            spec=DataSpec(task="classification", input_shape=cfg.shape, num_classes=cfg.num_classes),
            central_test=central,
            mean=mean,
            std=std,
        )


def _draw(rng: np.random.Generator, templates: np.ndarray, num: int) -> tuple[np.ndarray, np.ndarray]:
    """(num, C, H, W) uint8 images of random classes: (template + noise) / 2, and their labels."""
    labels = rng.integers(0, len(templates), size=num)
    images = rng.integers(0, 256, size=(num, *templates.shape[1:]), dtype=np.uint8)
    # Halve both before adding so that the sum stays in uint8 without a wider temporary.
    images >>= 1
    images += templates[labels] >> 1
    return images, labels
