"""What happens to a client's training batches before its local step: augmentation (a random crop
of the padded image and a horizontal flip, ``dataset.augment``), then a label-flipping attacker's
labels (``attack: {kind: label_flip}``), then the backdoor of the poisoned clients
(``dataset.poison``, ``raysim.data.poison``).

Every draw is a pure function of (run seed, round, client, batch number), like
``raysim.sampling``'s seeds: a client's batches do not depend on the worker or on what ran before.
With neither option set no transform exists and training is what it was, bit for bit.
Plain torch on batches (no torchvision): the draws are made on the CPU, the pixels move where the
batch is.

Usage:
    transform = training_transform(options, store, run_seed, round_num, client_id)  # None: no change
    batch = transform(batch, step)   # what ``train_local`` does to every batch
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raysim.config.sections import AugmentConfig, PoisonConfig
from raysim.data.poison import Batch, Pixels, poison_batch
from raysim.data.store import ClientStore, DatasetConfig
from raysim.sampling import client_seed

_BATCHES = 0x6A09E667F3BCC909 & (2**63 - 1)  # a stream apart from the client's shuffling


def crop_and_flip(
    x: torch.Tensor, padding: int, flip: bool, generator: torch.Generator, fill: torch.Tensor
) -> torch.Tensor:
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
    flip: torch.Tensor | None = None  # a label flipper's: the label each label becomes

    def __call__(self, batch: Batch, step: int) -> Batch:
        state = np.random.SeedSequence([self.seed, step, _BATCHES]).generate_state(1, np.uint64)
        generator = torch.Generator().manual_seed(int(state[0]))
        if self.augment is not None:
            channels = batch["x"].shape[1]
            black = self.pixels(torch.zeros(1, channels))[0]
            x = crop_and_flip(batch["x"], self.augment.crop_padding, self.augment.flip, generator, black)
            batch = {**batch, "x": x}
        if self.flip is not None:
            batch = {**batch, "y": self.flip.to(batch["y"].device)[batch["y"]]}
        if self.poison is not None:
            batch = poison_batch(batch, self.poison, generator, self.pixels)
        return batch


def training_transform(
    config: DatasetConfig,
    store: ClientStore,
    run_seed: int,
    round_num: int,
    client_id: int,
    flip: torch.Tensor | None = None,
) -> TrainingTransform | None:
    """The client's batch transform this round (``flip``: its labels' table, where it flips them);
    None when it has none (training as before)."""
    poison = config.poison if config.poison and client_id in config.poison.clients else None
    if config.augment is None and poison is None and flip is None:
        return None
    seed = client_seed(run_seed, round_num, client_id)
    return TrainingTransform(seed, config.augment, poison, image_scale(store), flip)
