"""scikit-learn's 1,797 real 8x8 handwritten digits: tiny, offline, for fast tests.

Pixel values 0..16 are rescaled to 0..255 and stored as uint8 like any other image dataset.

Usage:
    store = open_dataset("digits", DigitsConfig(partition=IidPartition(num_clients=10)))
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from raysim.data.partition import stratified_holdout
from raysim.data.store import DatasetConfig, Examples, channel_stats, image_table
from raysim.registry import register
from raysim.types import DataSpec

SHAPE = (1, 8, 8)


class DigitsConfig(DatasetConfig, frozen=True, extra="forbid"):
    """Digits recipe settings.

    Attributes:
        central_test_size: digits held out (stratified by class, seeded by ``seed``) as the
            central test set; 0 (the default) keeps every digit for the clients.
    """

    central_test_size: int = Field(0, ge=0, lt=1797)


@register("dataset", "digits")
class Digits:
    """sklearn load_digits: 1,797 real 1x8x8 digits, 10 classes."""

    Config = DigitsConfig
    DEFAULT_MODEL = {"name": "mlp", "hidden": [64]}  # a job that names no model (and no plugin's)

    def __init__(self, config: DigitsConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Loads the digits, rescales them to uint8 and holds out the central test set."""
        from sklearn.datasets import load_digits  # imported here: only building a store needs it

        digits = load_digits()
        images = np.rint(digits.data * (255 / 16)).astype(np.uint8).reshape(-1, *SHAPE)
        labels = digits.target.astype(np.int64)
        kept, held = stratified_holdout(labels, self.config.central_test_size, self.config.seed)
        mean, std = channel_stats(images[kept])  # from the clients' rows only: no test leakage
        return Examples(
            table=image_table(images[kept], labels[kept]),
            spec=DataSpec(task="classification", input_shape=SHAPE, num_classes=10),
            central_test=image_table(images[held], labels[held]) if len(held) else None,
            mean=mean,
            std=std,
        )
