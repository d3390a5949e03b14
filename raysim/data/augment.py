"""What happens to a client's training batches before its local step: augmentation (a random crop
of the padded image and a horizontal flip, ``dataset.augment``), then the backdoor of the poisoned
clients (``dataset.poison``, ``raysim.data.poison``).

Every draw is a pure function of (run seed, round, client, batch number), like
``raysim.sampling``'s seeds: a client's batches do not depend on the worker or on what ran before.
With neither option set no transform exists and training is what it was, bit for bit.
Plain torch on batches (no torchvision): the draws are made on the CPU, the pixels move where the
batch is.

Usage:
    check_training_options(dataset_options(job), store, job.engine.vectorize)   # before any worker
    data = TrainingData(job, store).round_data(client_id, round_num)   # what a worker trains on
    train_local(model, data, config, ...)   # applies data.batch_transform to every batch
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from raysim.config import JobConfig
from raysim.config.sections import AugmentConfig, PoisonConfig
from raysim.data.poison import Batch, Pixels, poison_batch, triggered_test
from raysim.data.store import ClientStore, DatasetConfig
from raysim.errors import ConfigError
from raysim.sampling import client_seed
from raysim.train.local import cap_examples
from raysim.types import ClientData

_BATCHES = 0x6A09E667F3BCC909 & (2**63 - 1)  # a stream apart from the client's shuffling
_TRIGGERED_TEST = 0x3C6EF372FE94F82B & (2**63 - 1)


def crop_and_flip(x: torch.Tensor, padding: int, flip: bool, generator: torch.Generator,
                  fill: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``x`` (n, C, H, W) padded by ``padding`` pixels of ``fill`` (C,) on each side, cut back to
    H x W at a random offset, then mirrored left-right with probability 1/2 per image.

    Draws the rows' offsets down, their offsets across, then (with ``flip``) one uniform per image.
    """
    n, channels, height, width = x.shape
    if padding:
        padded = fill.to(x.device, x.dtype)[None, :, None, None].repeat(
            n, 1, height + 2 * padding, width + 2 * padding
        )
        padded[:, :, padding : padding + height, padding : padding + width] = x
        down = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
        across = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
        rows = (down[:, None] + torch.arange(height, device=x.device))[:, :, None]
        cols = (across[:, None] + torch.arange(width, device=x.device))[:, None, :]
        x = padded[torch.arange(n, device=x.device)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    if flip:
        mirrored = (torch.rand(n, generator=generator) < 0.5).to(x.device)
        x = torch.where(mirrored[:, None, None, None], x.flip(-1), x)
    return x


def image_scale(store: ClientStore) -> Pixels:
    """Colours (n, C) on [0, 1] as the store's images hold them (normalised when it has mean/std)."""
    if store.mean is None or store.std is None:
        return lambda colours: colours
    mean, std = torch.tensor(store.mean), torch.tensor(store.std)
    return lambda colours: (colours - mean) / std


@dataclass(frozen=True)
class TrainingTransform:
    """One client's batch transform in one round (a ``raysim.types.BatchTransform``)."""

    seed: int  # the client's in this round (``raysim.sampling.client_seed``)
    augment: AugmentConfig | None
    poison: PoisonConfig | None  # None for a client that is not poisoned
    pixels: Pixels

    def __call__(self, batch: Batch, step: int) -> Batch:
        state = np.random.SeedSequence([self.seed, step, _BATCHES]).generate_state(1, np.uint64)
        generator = torch.Generator().manual_seed(int(state[0]))
        if self.augment is not None:
            channels = batch["x"].shape[1]
            black = self.pixels(torch.zeros(1, channels))[0]
            x = crop_and_flip(batch["x"], self.augment.crop_padding, self.augment.flip, generator, black)
            batch = {**batch, "x": x}
        if self.poison is not None:
            batch = poison_batch(batch, self.poison, generator, self.pixels)
        return batch


def training_transform(
    config: DatasetConfig, store: ClientStore, run_seed: int, round_num: int, client_id: int
) -> TrainingTransform | None:
    """The client's batch transform this round; None when it has none (training as before)."""
    poison = config.poison if config.poison and client_id in config.poison.clients else None
    if config.augment is None and poison is None:
        return None
    seed = client_seed(run_seed, round_num, client_id)
    return TrainingTransform(seed, config.augment, poison, image_scale(store))


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
        self.transforms = self.options.augment is not None or self.options.poison is not None
        self.triggered = backdoor_test(self.options, store, job.seed)  # None: nothing poisoned

    def round_data(self, client_id: int, round_num: int) -> ClientData:
        """The client's training examples this round, and what its batches go through."""
        seed, train = client_seed(self.job.seed, round_num, client_id), self.store.client_data(client_id)
        data = cap_examples(train, self.job.engine.max_client_examples, seed)
        transform = training_transform(self.options, self.store, self.job.seed, round_num, client_id)
        return data if transform is None else replace(data, batch_transform=transform)


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
            problems.append(f"dataset.{key}: works on image classification data (C, H, W), not "
                            f"{spec.task} with inputs {spec.input_shape}; remove dataset.{key}")  # fmt: skip
        elif vectorize == "on":
            problems.append(f"dataset.{key}: a vectorized round trains on the clients' data as stored; "
                            "set engine.vectorize to auto or off")  # fmt: skip
    if config.poison is not None and image:
        problems += _poison_problems(config.poison, store)
    if problems:
        raise ConfigError(problems)


def _poison_problems(poison: PoisonConfig, store: ClientStore) -> list[str]:
    channels, height, width = store.spec.input_shape
    classes, problems = store.spec.num_classes, []
    outside = [c for c in poison.clients if c >= store.num_clients]
    if outside:
        problems.append(f"dataset.poison.clients: client {outside[0]} is outside the population "
                        f"(ids 0..{store.num_clients - 1}); choose ids below {store.num_clients}")
    if poison.target is not None and poison.target >= classes:
        problems.append(f"dataset.poison.target: label {poison.target} is out of range for "
                        f"{classes} classes; choose 0..{classes - 1}")  # fmt: skip
    if poison.trigger_size > min(height, width):
        problems.append(f"dataset.poison.trigger_size: {poison.trigger_size} pixels do not fit "
                        f"{height}x{width} images; choose at most {min(height, width)}")  # fmt: skip
    if channels not in (1, 3):
        problems.append(f"dataset.poison: draws grey or RGB triggers, not on {channels} channels")
    if classes < 2:
        problems.append("dataset.poison: a backdoor needs at least 2 classes")
    return problems
