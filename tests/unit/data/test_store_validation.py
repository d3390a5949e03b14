"""``dataset.validation_fraction``: each client's training rows split into training and
validation rows, seeded by the run seed; the test split and the store without it untouched."""

import pickle

import numpy as np
import pytest

from raysim.data.partition import Partition
from raysim.data.prepare import write_store
from raysim.data.store import ClientStore, DatasetConfig, Examples, image_table
from raysim.errors import DataError
from raysim.types import DataSpec

SPEC = DataSpec("classification", (1, 2, 2), num_classes=3)


def row_id_examples(num_rows: int) -> Examples:
    """Rows whose four uint8 pixels spell the row index (as in test_store.py)."""
    pixels = np.arange(num_rows, dtype="<u4").view(np.uint8).reshape(num_rows, 1, 2, 2)
    return Examples(image_table(pixels, np.arange(num_rows) % 3), SPEC)


def row_ids(x: np.ndarray) -> np.ndarray:
    pixels = np.rint(x * 255).astype(np.uint8).reshape(len(x), 4)
    return pixels.copy().view("<u4").ravel().astype(np.int64)


@pytest.fixture
def store(tmp_path) -> ClientStore:
    """40 rows over 2 clients of 8 and 32 rows, test_fraction 0.25: 6 and 24 training rows."""
    part = Partition(order=np.random.default_rng(0).permutation(40), sizes=[8, 32])
    write_store(row_id_examples(40), part, 0.25, seed=0, path=tmp_path / "s")
    return ClientStore.open(tmp_path / "s")


def ids(store, client, split):
    return row_ids(store.client_data(client, split).arrays["x"]).tolist()


def test_no_fraction_is_the_store_itself(store):
    assert store.with_validation(0.0, seed=3) is store
    assert store.num_examples("validation").tolist() == [0, 0]


def test_validation_rows_are_carved_from_the_training_rows(store):
    """Fraction 0.25 of 6 and 24 training rows: round(1.5) = 2 and 6 validation rows; the rest
    train, in stored order; the test split is as before."""
    view = store.with_validation(0.25, seed=3)
    assert view.num_examples("validation").tolist() == [2, 6]
    assert view.num_examples("train").tolist() == [4, 18]
    assert store.num_examples("train").tolist() == [6, 24]  # the store itself is unchanged
    for client in (0, 1):
        stored = ids(store, client, "train")
        train, validation = ids(view, client, "train"), ids(view, client, "validation")
        assert sorted(train + validation) == sorted(stored) and not set(train) & set(validation)
        assert train == [i for i in stored if i in train]  # stored order kept
        assert ids(view, client, "test") == ids(store, client, "test")


def test_the_split_follows_the_seed_and_survives_pickling(store):
    view = store.with_validation(0.25, seed=3)
    again = pickle.loads(pickle.dumps(view))
    assert ids(again, 1, "validation") == ids(view, 1, "validation")
    assert ids(store.with_validation(0.25, seed=4), 1, "validation") != ids(view, 1, "validation")
    assert pickle.loads(pickle.dumps(store)).num_examples("validation").tolist() == [0, 0]


def test_the_fraction_leaves_the_store_hash_alone():
    """A store is built once for every validation fraction: it is carved at run time."""
    from raysim.data.prepare import store_path

    assert store_path("digits", DatasetConfig(validation_fraction=0.2)) == store_path(
        "digits", DatasetConfig()
    )


def test_an_unknown_or_absent_split_is_a_clear_error(store):
    with pytest.raises(DataError, match="'train', 'validation' or 'test'"):
        store.num_examples("dev")
    with pytest.raises(DataError, match="split 'validation' needs dataset.validation_fraction"):
        store.client_data(0, "validation")
