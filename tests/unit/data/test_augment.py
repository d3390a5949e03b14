"""``dataset.augment``: crop and flip against a numpy reference, draws seeded by (seed, round,
client, batch), and no transform at all when neither augment nor poison is set."""

from types import SimpleNamespace

import numpy as np
import torch

from raysim.config.sections import AugmentConfig, PoisonConfig
from raysim.data.augment import TrainingTransform, crop_and_flip, training_transform
from raysim.data.store import DatasetConfig
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

IMAGES = DataSpec(task="classification", input_shape=(1, 3, 3), num_classes=3)


def reference_crop_flip(x, padding, fill, down, across, mirrored):
    """Pad each (C, H, W) image with ``fill``, cut H x W at (down, across), mirror when asked."""
    n, c, h, w = x.shape
    out = np.empty_like(x)
    for i in range(n):
        padded = np.empty((c, h + 2 * padding, w + 2 * padding), x.dtype)
        padded[:] = fill[:, None, None]
        padded[:, padding : padding + h, padding : padding + w] = x[i]
        out[i] = padded[:, down[i] : down[i] + h, across[i] : across[i] + w]
        if mirrored[i]:
            out[i] = out[i][:, :, ::-1]
    return out


def test_crop_and_flip_moves_the_pixels_a_numpy_reference_moves():
    x = torch.arange(4 * 2 * 3 * 3, dtype=torch.float32).reshape(4, 2, 3, 3)
    fill = torch.tensor([-1.0, -2.0])
    seed, padding = 11, 1
    replay = torch.Generator().manual_seed(seed)  # the draws, in crop_and_flip's documented order
    down = torch.randint(0, 3, (4,), generator=replay).numpy()
    across = torch.randint(0, 3, (4,), generator=replay).numpy()
    mirrored = (torch.rand(4, generator=replay) < 0.5).numpy()
    assert mirrored.any() and not mirrored.all() and (down != 1).any()  # the seed exercises both

    out = crop_and_flip(x, padding, True, torch.Generator().manual_seed(seed), fill)

    expected = reference_crop_flip(x.numpy(), padding, fill.numpy(), down, across, mirrored)
    np.testing.assert_array_equal(out.numpy(), expected)


def test_a_crop_without_flip_of_one_image_by_hand():
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    replay = torch.Generator().manual_seed(0)
    down, across = (int(torch.randint(0, 3, (1,), generator=replay)) for _ in range(2))
    out = crop_and_flip(x, 1, False, torch.Generator().manual_seed(0), torch.tensor([0.0]))
    padded = [[0, 0, 0, 0], [0, 1, 2, 0], [0, 3, 4, 0], [0, 0, 0, 0]]
    expected = [row[across : across + 2] for row in padded[down : down + 2]]
    assert out[0, 0].tolist() == expected


def transform(seed=5, augment=AugmentConfig(crop_padding=1)):
    return TrainingTransform(seed, augment, None, lambda colours: colours)


def batch(n=6):
    x = torch.randn(n, 1, 3, 3, generator=torch.Generator().manual_seed(1))
    return {"x": x, "y": torch.zeros(n, dtype=torch.long)}


def test_the_same_seed_and_batch_give_the_same_pixels_and_another_round_others():
    same = transform()(batch(), 2), transform()(batch(), 2)
    assert torch.equal(same[0]["x"], same[1]["x"])
    assert not torch.equal(transform()(batch(), 3)["x"], same[0]["x"])  # the next batch
    assert not torch.equal(transform(seed=6)(batch(), 2)["x"], same[0]["x"])  # another round or client


def test_the_seed_is_the_clients_in_the_round():
    config = DatasetConfig(augment=AugmentConfig())
    store = SimpleNamespace(mean=None, std=None)
    seeds = {training_transform(config, store, 0, r, c).seed for r in (0, 1) for c in (0, 1)}
    assert len(seeds) == 4
    assert training_transform(config, store, 0, 1, 1).seed == training_transform(config, store, 0, 1, 1).seed


def test_off_means_no_transform():
    assert training_transform(DatasetConfig(), SimpleNamespace(mean=None, std=None), 0, 0, 0) is None


def test_train_local_hands_every_batch_and_its_number_to_the_transform():
    seen = []

    def record(b, step):
        seen.append((step, len(b["y"])))
        return b

    x = np.zeros((5, 1, 3, 3), np.float32)
    data = ClientData({"x": x, "y": np.zeros(5, np.int64)}, batch_transform=record)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(9, 3))
    train_local(model, data, LocalTrainConfig(epochs=2, batch_size=2), seed=0, spec=IMAGES)
    assert seen == [(0, 2), (1, 2), (2, 1), (3, 2), (4, 2), (5, 1)]


def test_the_options_leave_the_stores_hash_alone():
    from raysim.data.prepare import store_path

    plain = DatasetConfig(cache_dir="/c")
    trained = DatasetConfig(cache_dir="/c", augment=AugmentConfig(), poison=PoisonConfig(clients=[0]))
    assert store_path("digits", trained) == store_path("digits", plain)
