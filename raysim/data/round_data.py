"""A client's training data as a round trains on it: the seeded subset of
``engine.max_client_examples`` (``cap_examples``), with the batch transform of the dataset's
``augment`` and ``poison`` (``raysim.data.augment``); the validation split set apart from the
clients' training rows; and the checks that refuse options the data cannot take.

Usage:
    check_training_options(dataset_options(job), store, job.engine.vectorize)   # before any worker
    data = TrainingData(job, store).round_data(client_id, round_num)   # what a worker trains on
    train_local(model, data, config, ...)   # applies data.batch_transform to every batch
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from raysim.config import JobConfig
from raysim.config.robust import LabelFlip
from raysim.config.sections import PoisonConfig
from raysim.data.augment import image_scale, training_transform
from raysim.data.poison import triggered_test
from raysim.data.store import ClientStore, DatasetConfig
from raysim.errors import ConfigError
from raysim.robust.attacks import flip_label_table, job_malicious
from raysim.sampling import client_seed
from raysim.types import ClientData

_TRIGGERED_TEST = 0x3C6EF372FE94F82B & (2**63 - 1)  # the trigger's test set: a stream of its own


def cap_examples(data: ClientData, max_examples: int | None, seed: int) -> ClientData:
    """The client's examples this round: all, or one seeded random subset of ``max_examples``.

    The engine applies it (``engine.max_client_examples``) before ``client_update`` and before
    measuring the client-server barrier; a pure function of ``seed``.
    """
    if max_examples is None or len(data) <= max_examples:
        return data
    keep = np.sort(np.random.default_rng([seed, 0x5EED]).permutation(len(data))[:max_examples])
    return ClientData({k: v[keep] for k, v in data.arrays.items()})


def dataset_options(job: JobConfig) -> DatasetConfig:
    """The job's dataset section's options (every recipe's ``Config`` is a ``DatasetConfig``)."""
    config = job.dataset.config
    assert isinstance(config, DatasetConfig), "registry.require_config_base holds for datasets"
    return config


def with_validation_split(store: ClientStore, job: JobConfig) -> ClientStore:
    """The store as the run trains on it: with ``dataset.validation_fraction`` of each client's
    training rows set apart for validation, chosen by the run seed (the store itself when 0)."""
    return store.with_validation(dataset_options(job).validation_fraction, job.seed)


class TrainingData:
    """A worker's clients' training data as a round trains on it: the seeded subset of
    ``engine.max_client_examples``, with the batch transform of the dataset's ``augment`` and
    ``poison``; and the central test set with the trigger (the map split ``"triggered"``)."""

    def __init__(self, job: JobConfig, store: ClientStore) -> None:
        self.job, self.store, self.options = job, store, dataset_options(job)
        self.flippers, self.flip = label_flippers(job, store)
        self.transforms = (
            self.options.augment is not None or self.options.poison is not None or bool(self.flippers)
        )
        self.triggered = backdoor_test(self.options, store, job.seed)  # None: nothing poisoned
        if self.triggered is None and self.flip is not None:  # label flipping's success, measured alike
            self.triggered = flipped_test(store, self.flip)

    def round_data(self, client_id: int, round_num: int) -> ClientData:
        """The client's training examples this round, and what its batches go through."""
        seed, train = client_seed(self.job.seed, round_num, client_id), self.store.client_data(client_id)
        data = cap_examples(train, self.job.engine.max_client_examples, seed)
        flip = self.flip if client_id in self.flippers else None
        transform = training_transform(self.options, self.store, self.job.seed, round_num, client_id, flip)
        return data if transform is None else replace(data, batch_transform=transform)


def label_flippers(job: JobConfig, store: ClientStore) -> tuple[frozenset[int], torch.Tensor | None]:
    """A label-flipping attack's malicious clients and its label table (none without one)."""
    attack = job.attack
    if not isinstance(attack, LabelFlip):
        return frozenset(), None
    malicious = job_malicious(job, store.num_clients, ("label_flip",))
    return malicious, flip_label_table(store.spec.num_classes, attack.mapping)


def flipped_test(store: ClientStore, flip: torch.Tensor) -> ClientData | None:
    """The central test examples whose label the attack changes, labelled as flipped: a model's
    accuracy on them is the attack's success (the share predicted as the flipped class)."""
    test = store.central_test()
    if test is None:
        return None
    y = torch.from_numpy(test.arrays["y"]).long()
    keep = (flip[y] != y).numpy()
    arrays = {k: v[keep] for k, v in test.arrays.items()}
    return ClientData({**arrays, "y": flip[y[keep]].numpy().astype(test.arrays["y"].dtype)})


def backdoor_test(config: DatasetConfig, store: ClientStore, seed: int) -> ClientData | None:
    """The central test set with the trigger stamped, labelled with the trigger's label
    (``triggered_test``); None without poisoning or a central test set."""
    test = store.central_test()
    if config.poison is None or test is None:
        return None
    scale, classes = image_scale(store), store.spec.num_classes
    return triggered_test(test, config.poison, seed ^ _TRIGGERED_TEST, scale, classes)


def check_training_options(config: DatasetConfig, store: ClientStore, vectorize: str) -> None:
    """Refuses augmentation and poisoning the data cannot take, naming the key.

    Raises:
        ConfigError: every problem, e.g. a non-image task, a poisoned client id outside the
            population, a target label out of range, a trigger larger than the images.
    """
    spec, problems = store.spec, []
    image = spec.task == "classification" and len(spec.input_shape) == 3
    for key in ("augment", "poison"):
        if getattr(config, key) is None:
            continue
        if not image:
            problems.append(
                f"dataset.{key}: works on image classification data (C, H, W), not "
                f"{spec.task} with inputs {spec.input_shape}; remove dataset.{key}"
            )
        elif vectorize == "on":
            problems.append(
                f"dataset.{key}: a vectorized round trains on the clients' data as stored; "
                "set engine.vectorize to auto or off"
            )
    if config.poison is not None and image:
        problems += _poison_problems(config.poison, store)
    if problems:
        raise ConfigError(problems)


def _poison_problems(poison: PoisonConfig, store: ClientStore) -> list[str]:
    channels, height, width = store.spec.input_shape
    classes, problems = store.spec.num_classes, []
    outside = [c for c in poison.clients if c >= store.num_clients]
    if outside:
        problems.append(
            f"dataset.poison.clients: client {outside[0]} is outside the population "
            f"(ids 0..{store.num_clients - 1}); choose ids below {store.num_clients}"
        )
    if poison.target is not None and poison.target >= classes:
        problems.append(
            f"dataset.poison.target: label {poison.target} is out of range for "
            f"{classes} classes; choose 0..{classes - 1}"
        )
    if poison.trigger_size > min(height, width):
        problems.append(
            f"dataset.poison.trigger_size: {poison.trigger_size} pixels do not fit "
            f"{height}x{width} images; choose at most {min(height, width)}"
        )
    if channels not in (1, 3):
        problems.append(f"dataset.poison: draws grey or RGB triggers, not on {channels} channels")
    if classes < 2:
        problems.append("dataset.poison: a backdoor needs at least 2 classes")
    return problems
