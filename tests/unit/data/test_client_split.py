"""Per-client test splits stratified by label, or fixed by the source, against hand counts."""

import numpy as np
import pyarrow as pa
import pytest

from raysim.data.client_split import stratified_test_rows
from raysim.data.partition import IidPartition, Partition
from raysim.data.prepare import store_path, write_store
from raysim.data.store import ClientStore, Examples, image_table
from raysim.errors import DataError
from raysim.types import DataSpec

SPEC = DataSpec("classification", (1, 1, 1), 3)


def examples(labels: np.ndarray, **columns) -> Examples:
    """One-pixel images holding their row number, so a split's rows can be named."""
    rows = np.arange(len(labels), dtype=np.uint8).reshape(-1, 1, 1, 1)
    return Examples(image_table(rows, labels, **columns), SPEC)


def test_one_clients_test_rows_follow_its_labels_by_hand():
    """10 rows: 6 of class 0, 3 of class 1, 1 of class 2; test_fraction 0.25 keeps
    floor(2.5 + 0.5) = 3 test rows. Quotas 6*3/10 = 1.8, 0.9, 0.3 floor to 1, 0, 0; the 2 rows
    left go to the largest remainders, class 1 (0.9) and class 0 (0.8): 2, 1 and 0 test rows."""
    labels = np.array([0, 1, 0, 2, 0, 1, 0, 0, 1, 0])
    part = Partition(np.arange(10), [10])
    is_test = stratified_test_rows(part, labels, 0.25, seed=0)
    assert np.bincount(labels[is_test], minlength=3).tolist() == [2, 1, 0]
    other_seed = stratified_test_rows(part, labels, 0.25, seed=1)
    assert np.bincount(labels[other_seed], minlength=3).tolist() == [2, 1, 0]
    draws = {tuple(np.flatnonzero(stratified_test_rows(part, labels, 0.25, s))) for s in range(8)}
    assert len(draws) > 1  # which rows go is a seeded choice


def test_each_client_is_stratified_on_its_own_rows_only():
    """Client 0 holds rows 4..7 (classes 1, 1, 2, 2): 0.5 of 4 is 2 test rows, one per class.
    Client 1 holds rows 0..3 (class 0 x3, class 1): 2 test rows, quotas 1.5 and 0.5, a tie
    broken toward the lower label: 2 of class 0."""
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    part = Partition(np.array([4, 5, 6, 7, 0, 1, 2, 3]), [4, 4])
    is_test = stratified_test_rows(part, labels, 0.5, seed=2)
    assert np.bincount(labels[4:][is_test[4:]], minlength=3).tolist() == [0, 1, 1]
    assert np.bincount(labels[:4][is_test[:4]], minlength=3).tolist() == [2, 0, 0]


def test_a_stratified_store_holds_the_stratified_rows_as_each_clients_test_split(tmp_path):
    labels = np.array([0, 1, 0, 2, 0, 1, 0, 0, 1, 0])
    part = Partition(np.arange(10), [10])
    store = ClientStore.open(write_store(examples(labels), part, 0.25, 5, tmp_path, stratify=True))
    test = store.client_data(0, "test").arrays
    assert np.bincount(test["y"], minlength=3).tolist() == [2, 1, 0]
    expected = np.flatnonzero(stratified_test_rows(part, labels, 0.25, seed=5))
    assert sorted(np.rint(test["x"].ravel() * 255).astype(int).tolist()) == expected.tolist()
    assert store.label_histogram(0).tolist() == [4, 2, 1]  # the train rows


def test_a_source_split_column_decides_each_clients_test_rows(tmp_path):
    """Rows 0-5 to client 0, 6-9 to client 1; rows 1, 2 and 9 are marked test (test_fraction unused)."""
    is_test = np.zeros(10, bool)
    is_test[[1, 2, 9]] = True
    table = examples(np.zeros(10, np.int64), is_test=pa.array(is_test))
    store = ClientStore.open(write_store(table, Partition(np.arange(10), [6, 4]), 0.5, 0, tmp_path))
    assert store.num_examples("test").tolist() == [2, 1]
    tests = [
        sorted(np.rint(store.client_data(c, "test").arrays["x"].ravel() * 255).astype(int)) for c in (0, 1)
    ]
    assert tests == [[1, 2], [9]]


def test_a_split_column_must_be_boolean(tmp_path):
    table = examples(np.zeros(4, np.int64), is_test=pa.array([0, 1, 0, 1]))
    with pytest.raises(DataError, match="'is_test' must be boolean"):
        write_store(table, Partition(np.arange(4), [4]), 0.5, 0, tmp_path)


def test_stratifying_needs_labels(tmp_path):
    table = Examples(
        pa.table({"x": pa.array(np.arange(4, dtype=np.float32))}), DataSpec("regression", (1,), 0)
    )
    with pytest.raises(DataError, match="stratify_test"):
        write_store(table, Partition(np.arange(4), [4]), 0.5, 0, tmp_path, stratify=True)


def test_the_option_off_leaves_the_store_name_as_before():
    from raysim.data.store import DatasetConfig

    off = DatasetConfig(partition=IidPartition(num_clients=3))
    assert "stratify_test" not in off.model_dump()
    on = off.model_copy(update={"stratify_test": True})
    assert store_path("digits", off) == store_path(
        "digits", DatasetConfig(partition=IidPartition(num_clients=3))
    )
    assert store_path("digits", on) != store_path("digits", off)


def test_text_stores_refuse_a_stratified_split():
    from pydantic import ValidationError

    from raysim.data.text.recipes import TextDatasetConfig

    with pytest.raises(ValidationError, match="stratify_test"):
        TextDatasetConfig(stratify_test=True)


def test_a_client_left_only_test_rows_by_the_source_split_is_refused(tmp_path):
    """Client 1 holds rows 2 and 3, both marked test: it could not train."""
    table = examples(np.zeros(4, np.int64), is_test=pa.array([False, True, True, True]))
    with pytest.raises(DataError, match=r"the first: client 1\) hold only test rows"):
        write_store(table, Partition(np.arange(4), [2, 2]), 0.5, 0, tmp_path)
