"""What a round trains on: the seeded cap of ``engine.max_client_examples``, and the checks that
refuse augmentation and poisoning the data cannot take, naming the key."""

from types import SimpleNamespace

import numpy as np
import pytest

from raysim.config.sections import AugmentConfig, PoisonConfig
from raysim.data.round_data import cap_examples, check_training_options
from raysim.data.store import DatasetConfig
from raysim.errors import ConfigError
from raysim.types import ClientData, DataSpec

IMAGES = DataSpec(task="classification", input_shape=(1, 3, 3), num_classes=3)


def data(n):
    rng = np.random.default_rng(0)
    return ClientData(
        {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": (np.arange(n) % 2).astype(np.int64)}
    )


def test_cap_is_one_seeded_subset_of_distinct_rows():
    full = data(12)
    a, b = cap_examples(full, 5, seed=9), cap_examples(full, 5, seed=9)
    assert len(a) == 5 and np.array_equal(a.arrays["x"], b.arrays["x"])
    rows = {tuple(r) for r in a.arrays["x"].tolist()}
    assert len(rows) == 5 and rows <= {tuple(r) for r in full.arrays["x"].tolist()}
    assert not np.array_equal(a.arrays["x"], cap_examples(full, 5, seed=10).arrays["x"])
    assert cap_examples(full, 50, seed=9) is full


def store_of(spec, num_clients=4):
    return SimpleNamespace(spec=spec, num_clients=num_clients, mean=None, std=None)


@pytest.mark.parametrize(
    "options, vectorize, key",
    [
        ({"augment": AugmentConfig()}, "off", "dataset.augment: works on image classification"),
        ({"poison": PoisonConfig(clients=[0])}, "off", "dataset.poison: works on image classification"),
    ],
)
def test_non_image_data_is_refused_naming_the_key(options, vectorize, key):
    text = DataSpec(task="causal_lm", input_shape=(16,), num_classes=50)
    with pytest.raises(ConfigError, match=key):
        check_training_options(DatasetConfig(**options), store_of(text), vectorize)


@pytest.mark.parametrize(
    "poison, key",
    [
        (PoisonConfig(clients=[1, 4]), "dataset.poison.clients: client 4 is outside the population"),
        (PoisonConfig(clients=[0], target=3), "dataset.poison.target: label 3 is out of range"),
        (PoisonConfig(clients=[0], trigger_size=4), "dataset.poison.trigger_size: 4 pixels do not fit"),
    ],
)
def test_bad_poisoning_is_refused_naming_the_key(poison, key):
    with pytest.raises(ConfigError, match=key):
        check_training_options(DatasetConfig(poison=poison), store_of(IMAGES), "off")


def test_a_vectorized_round_is_refused_with_augmentation():
    with pytest.raises(ConfigError, match="dataset.augment: .*set engine.vectorize to auto or off"):
        check_training_options(DatasetConfig(augment=AugmentConfig()), store_of(IMAGES), "on")
    check_training_options(DatasetConfig(augment=AugmentConfig()), store_of(IMAGES), "auto")
