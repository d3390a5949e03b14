"""The client store: round trip, split rule, normalisation, caching, errors, scale."""

from __future__ import annotations

import json
import pickle
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raysim import registry
from raysim.data.format import split_sizes
from raysim.data.partition import IidPartition, NaturalPartition, Partition
from raysim.data.prepare import open_dataset, prepare_store, write_store
from raysim.data.store import ClientStore, DatasetConfig, Examples, image_table
from raysim.errors import ConfigError, DataError
from raysim.types import DataSpec

SPEC = DataSpec("classification", (1, 2, 2), num_classes=3)


def row_id_examples(num_rows: int, **extra) -> Examples:
    """Rows whose four uint8 pixels spell the row index (little-endian), labels row % 3."""
    pixels = np.arange(num_rows, dtype="<u4").view(np.uint8).reshape(num_rows, 1, 2, 2)
    return Examples(image_table(pixels, np.arange(num_rows) % 3), SPEC, **extra)


def row_ids(x: np.ndarray) -> np.ndarray:
    """Inverse of ``row_id_examples`` for un-normalised reads (x = pixels / 255)."""
    pixels = np.rint(x * 255).astype(np.uint8).reshape(len(x), 4)
    return pixels.copy().view("<u4").ravel().astype(np.int64)


@pytest.fixture
def small_store(tmp_path) -> tuple[ClientStore, Partition]:
    """20 rows over 4 clients of 1, 2, 3 and 14 rows (natural keys), test_fraction 0.25."""
    part = Partition(
        order=np.random.default_rng(0).permutation(20),
        sizes=[1, 2, 3, 14],
        keys=["ann", "bob", "cy", "dee"],
    )
    central = image_table(np.full((2, 1, 2, 2), 7, np.uint8), np.array([1, 2]))
    write_store(row_id_examples(20, central_test=central), part, 0.25, seed=0, path=tmp_path / "s")
    return ClientStore.open(tmp_path / "s"), part


def test_split_rule_rounds_half_up_and_keeps_a_train_row():
    """test = min(floor(n * f + 1/2), n - 1).

    f = 0.25, n = 1, 2, 3, 14, 4: n * f = 0.25, 0.5, 0.75, 3.5, 1.0 -> test 0, 1, 1, 4, 1.
    f = 0.6, n = 1, 2: n * f = 0.6, 1.2 -> 1, 1, but the last train row stays: test 0, 1.
    """
    num_train, num_test = split_sizes(np.array([1, 2, 3, 14, 4]), 0.25)
    assert num_test.tolist() == [0, 1, 1, 4, 1]
    assert num_train.tolist() == [1, 1, 2, 10, 3]
    assert split_sizes(np.array([1, 2]), 0.6)[1].tolist() == [0, 1]
    assert split_sizes(np.array([0, 1, 10]), 0.0)[1].tolist() == [0, 0, 0]


def test_round_trip_every_row_once_in_its_client(small_store):
    store, part = small_store
    assert store.num_clients == 4
    assert store.num_examples("train").tolist() == [1, 1, 2, 10]
    assert store.num_examples("test").tolist() == [0, 1, 1, 4]
    seen = []
    for cid in range(4):
        train, test = store.client_data(cid, "train"), store.client_data(cid, "test")
        rows = np.concatenate([row_ids(train.arrays["x"]), row_ids(test.arrays["x"])])
        assert sorted(rows.tolist()) == sorted(part.rows(cid).tolist())
        assert np.array_equal(train.arrays["y"], row_ids(train.arrays["x"]) % 3)
        assert train.arrays["x"].shape == (len(train), 1, 2, 2)
        assert train.arrays["x"].dtype == np.float32 and train.arrays["y"].dtype == np.int64
        seen.append(rows)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(20))


def test_split_is_seeded_shuffle(tmp_path):
    part = Partition(order=np.arange(40), sizes=[40])
    for seed in (0, 0, 1):
        write_store(row_id_examples(40), part, 0.5, seed, tmp_path / str(seed))
    first, again, other = (ClientStore.open(tmp_path / s).client_data(0, "test") for s in "001")
    assert np.array_equal(first.arrays["x"], again.arrays["x"])
    assert not np.array_equal(first.arrays["x"], other.arrays["x"])
    assert sorted(row_ids(first.arrays["x"]).tolist()) != list(range(20, 40))  # shuffled first


def test_label_histograms_count_train_rows(small_store):
    store, _ = small_store
    for cid in range(4):
        expected = np.bincount(store.client_data(cid, "train").arrays["y"], minlength=3)
        assert store.label_histogram(cid).tolist() == expected.tolist()


def test_keys_and_central_test(small_store):
    store, _ = small_store
    assert [store.client_key(c) for c in range(4)] == ["ann", "bob", "cy", "dee"]
    central = store.central_test()
    assert central.arrays["y"].tolist() == [1, 2]
    assert np.allclose(central.arrays["x"], 7 / 255)


def test_keyless_clients_are_named_by_id(tmp_path):
    write_store(row_id_examples(4), Partition(np.arange(4), [2, 2]), 0.0, 0, tmp_path)
    store = ClientStore.open(tmp_path)
    assert store.client_key(1) == "1"
    assert store.central_test() is None


def test_normalisation_per_channel(tmp_path):
    """Pixel 255 -> 1.0 and 0 -> 0.0, then (v - mean) / std per channel:
    channel 0 (mean .5, std .25): 1 -> 2, 0 -> -2; channel 1 (mean .25, std .5): 1 -> 1.5, 0 -> -.5.
    """
    pixels = np.array([[[[255, 0]], [[255, 0]]]], np.uint8)  # (1, C=2, H=1, W=2)
    spec = DataSpec("classification", (2, 1, 2), num_classes=1)
    examples = Examples(image_table(pixels, [0]), spec, mean=(0.5, 0.25), std=(0.25, 0.5))
    write_store(examples, Partition(np.arange(1), [1]), 0.0, 0, tmp_path)
    x = ClientStore.open(tmp_path).client_data(0, "train").arrays["x"]
    assert x.tolist() == [[[[2.0, -2.0]], [[1.5, -0.5]]]]


def test_token_lists_are_truncated_or_padded(tmp_path):
    """Variable-length token rows read as (n, 3) int64, padded with pad_token_id 9."""
    tokens = pa.array([[1, 2], [3, 4, 5, 6], []], pa.list_(pa.int32()))
    spec = DataSpec("causal_lm", (3,), num_classes=10, pad_token_id=9)
    write_store(
        Examples(pa.table({"x": tokens}), spec),
        Partition(np.arange(3), [1, 1, 1]),
        0.0,
        0,
        tmp_path,
    )
    store = ClientStore.open(tmp_path)
    rows = [store.client_data(c, "train").arrays for c in range(3)]
    assert [r["x"].tolist() for r in rows] == [[[1, 2, 9]], [[3, 4, 5]], [[9, 9, 9]]]
    assert rows[0]["x"].dtype == np.int64 and "y" not in rows[0]


def test_store_pickles_as_its_path(small_store):
    store, _ = small_store
    blob = pickle.dumps(store)
    assert len(blob) < 500  # the path and a reference to ClientStore.open, no rows
    clone = pickle.loads(blob)
    assert np.array_equal(clone.client_data(3, "test").arrays["x"], store.client_data(3, "test").arrays["x"])


def test_out_of_range_client_and_bad_split(small_store):
    store, _ = small_store
    with pytest.raises(DataError, match="out of range"):
        store.client_data(4, "train")
    with pytest.raises(DataError, match="out of range"):
        store.label_histogram(-1)
    with pytest.raises(DataError, match="split"):
        store.client_data(0, "validation")


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="no client store"):
        ClientStore.open(tmp_path / "nowhere")


REBUILD = r"; delete the folder and prepare it again: rm -r \S+, then raysim prepare JOB.yaml"


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ("{not json", "has no readable meta.json"),
        ("", "has no readable meta.json"),
        (b"\xff\xfe\x00garbage", "has no readable meta.json"),  # not even text
        ("[1, 2]", "meta.json holds a list, not an object"),
        (json.dumps({"format_version": 99}), "has format version 99, this raysim reads 1"),
        (json.dumps({"format_version": 1}), "meta.json lacks spec, num_clients, mean, std"),
    ],
    ids=["not json", "empty", "bytes", "list", "version", "keys"],
)
def test_bad_meta_is_a_data_error_naming_the_store_and_the_fix(small_store, meta, message):
    store, _ = small_store
    write = (
        (store.path / "meta.json").write_bytes
        if isinstance(meta, bytes)
        else (store.path / "meta.json").write_text
    )
    write(meta)
    with pytest.raises(DataError, match=f"client store {re.escape(str(store.path))}.*{message}.*{REBUILD}"):
        ClientStore.open(store.path)


def test_meta_with_a_malformed_spec_is_a_data_error(small_store):
    store, _ = small_store
    meta = json.loads((store.path / "meta.json").read_text())
    del meta["meta_blake2b"]  # as in a store prepared before it: content checks still run
    (store.path / "meta.json").write_text(json.dumps(meta | {"spec": 5}))
    with pytest.raises(
        DataError, match=f"client store {re.escape(str(store.path))}: meta.json is malformed.*{REBUILD}"
    ):
        ClientStore.open(store.path)


def corrupt_index(path: Path, how: str) -> None:
    index = path / "clients.parquet"
    if how == "truncated":
        index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    elif how == "garbage":
        index.write_bytes(np.random.default_rng(0).bytes(400))
    elif how == "empty":
        index.write_bytes(b"")
    else:  # a parquet file, but not a client index
        pq.write_table(pa.table({"client": [0, 1, 2, 3]}), index)


def drop_checksums(path: Path) -> None:
    """Makes ``path`` look like a store prepared before per-file checksums existed (and before
    counts.npy, so that its index is read from clients.parquet)."""
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"], meta["meta_blake2b"]
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "counts.npy").unlink()


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "other table"])
def test_a_corrupt_client_index_is_a_data_error_naming_the_store_file_and_the_fix(small_store, how):
    """The size check on open catches each (none of them keeps the index's size)."""
    store, _ = small_store
    corrupt_index(store.path, how)
    with pytest.raises(
        DataError,
        match=f"client store {re.escape(str(store.path))}: clients.parquet is [0-9,]+ bytes, not the "
        f"[0-9,]+ it was written with.*{REBUILD}",
    ):
        ClientStore.open(store.path)


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "other table"])
def test_a_corrupt_index_of_a_store_without_checksums_is_a_data_error(small_store, how):
    store, _ = small_store
    drop_checksums(store.path)
    corrupt_index(store.path, how)
    with pytest.raises(
        DataError, match=f"client store {re.escape(str(store.path))} is unreadable.*{REBUILD}"
    ):
        ClientStore.open(store.path)


def test_missing_rows_file_is_a_clear_error(small_store):
    store, _ = small_store
    (store.path / "rows.arrow").unlink()
    with pytest.raises(DataError, match="rows.arrow is missing"):
        ClientStore.open(store.path)
    drop_checksums(store.path)
    with pytest.raises(DataError, match="unreadable"):
        ClientStore.open(store.path)


@pytest.fixture
def grouped_store(tmp_path, monkeypatch) -> tuple[Path, Partition]:
    """45 rows over 12 clients (0 to 7 rows each), written in row groups of 5 clients."""
    monkeypatch.setattr("raysim.data.prepare.BATCH_ROWS", 5)
    sizes = np.array([3, 0, 7, 1, 5, 2, 6, 4, 1, 7, 3, 6])
    part = Partition(order=np.random.default_rng(1).permutation(45), sizes=sizes)
    write_store(row_id_examples(45), part, 0.3, seed=0, path=tmp_path / "g")
    return tmp_path / "g", part


def test_index_read_by_row_group_answers_as_a_whole_table_read(grouped_store):
    path, part = grouped_store
    assert pq.ParquetFile(path / "clients.parquet").metadata.num_row_groups == 3
    whole = pq.read_table(path / "clients.parquet")  # the plain read the store avoids
    store = ClientStore.open(path)
    num_train, num_test = whole.column("num_train").to_numpy(), whole.column("num_test").to_numpy()
    assert np.array_equal(store.num_examples("train"), num_train)
    assert np.array_equal(store.num_examples("test"), num_test)
    assert store.num_examples("train").dtype == np.int64 and not store.num_examples("train").flags.writeable
    offsets = whole.column("offset").to_numpy()
    for cid in range(12):
        train, test = store.client_data(cid, "train"), store.client_data(cid, "test")
        assert (len(train), len(test)) == (num_train[cid], num_test[cid])
        rows = [*row_ids(train.arrays["x"]), *row_ids(test.arrays["x"])]
        assert sorted(rows) == sorted(part.rows(cid).tolist())
        assert offsets[cid] == part.sizes[:cid].sum()


def test_counts_past_the_rows_are_refused(grouped_store):
    path, _ = grouped_store
    counts = np.load(path / "counts.npy")
    counts[0, 11] += 1  # the last client's offset: it now ends one row past rows.arrow
    np.save(path / "counts.npy", counts)
    with pytest.raises(DataError, match="does not match"):
        ClientStore.open(path)


def test_an_index_past_the_rows_is_refused_in_any_row_group(grouped_store):
    """A store prepared before counts.npy reads its counts from clients.parquet."""
    path, _ = grouped_store
    drop_checksums(path)
    index = pq.read_table(path / "clients.parquet")
    offsets = index.column("offset").to_numpy().copy()
    offsets[11] += 1  # the last client, in the last row group, now ends one row past rows.arrow
    index = index.set_column(index.column_names.index("offset"), "offset", pa.array(offsets))
    pq.write_table(index, path / "clients.parquet", row_group_size=5)
    with pytest.raises(DataError, match="does not match"):
        ClientStore.open(path)


def test_label_histograms_past_the_index_formats_int32_limits_are_refused(tmp_path, monkeypatch):
    """list<int32> histograms: clients per row group x classes, and each count, below 2**31 (here
    lowered to 10, so that a test store reaches it) before anything is written."""
    monkeypatch.setattr("raysim.data.prepare._INT32_MAX", 10)
    monkeypatch.setattr("raysim.data.prepare.BATCH_ROWS", 4)
    even = Partition(np.arange(8), [2] * 4)  # 4 clients in a row group x 3 classes = 12 > 10
    with pytest.raises(DataError, match=r"spec.num_classes: 3 classes over 4 clients.*at most 2 classes"):
        write_store(row_id_examples(8), even, 0.0, 0, tmp_path / "a")
    one = Partition(np.arange(11), [11])  # 1 client x 3 classes fits, but its 11 rows do not
    with pytest.raises(DataError, match=r"partition: client 0 holds 11 rows.*raise partition.num_clients"):
        write_store(row_id_examples(11), one, 0.0, 0, tmp_path / "b")
    assert not (tmp_path / "a" / "rows.arrow").exists() and not (tmp_path / "b" / "rows.arrow").exists()


def test_partition_using_a_row_twice_is_rejected(tmp_path):
    with pytest.raises(DataError, match="more than once"):
        write_store(row_id_examples(4), Partition(np.array([0, 1, 1, 2]), [4]), 0.0, 0, tmp_path)


class CountingConfig(DatasetConfig, frozen=True, extra="forbid"):
    num_rows: int = 30


class CountingRecipe:
    """A recipe that counts how often its data is loaded."""

    Config = CountingConfig
    loads = 0

    def __init__(self, config: CountingConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        type(self).loads += 1
        examples = row_id_examples(self.config.num_rows)
        speakers = pa.array([f"s{i % 4}" for i in range(self.config.num_rows)])
        return Examples(examples.table.append_column("speaker", speakers), SPEC)


@pytest.fixture
def counting(monkeypatch, tmp_path):
    # Skip the scan of the real plugin folders: these tests need only the recipe above, which is
    # registered for this test alone so that other tests see the real list of datasets.
    monkeypatch.setattr(registry, "load_builtins", lambda: None)
    entry = registry.Entry("dataset", "test_counting", CountingRecipe, CountingConfig, "counts")
    monkeypatch.setitem(registry._entries["dataset"], "test_counting", entry)
    monkeypatch.setattr(CountingRecipe, "loads", 0)
    return CountingConfig(cache_dir=str(tmp_path / "cache"), partition=IidPartition(num_clients=3))


def test_prepare_store_is_cached(counting):
    first = prepare_store("test_counting", counting)
    second = prepare_store("test_counting", counting)
    assert first == second and CountingRecipe.loads == 1
    assert first.name.startswith("test_counting-")
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dirs left behind
    meta = ClientStore.open(first).meta
    assert meta["recipe"] == "test_counting" and meta["config"]["num_rows"] == 30


def test_config_change_builds_a_new_store_and_cache_dir_does_not(counting, tmp_path):
    base = prepare_store("test_counting", counting)
    other = prepare_store("test_counting", counting.model_copy(update={"num_rows": 31}))
    moved = prepare_store("test_counting", counting.model_copy(update={"cache_dir": str(tmp_path / "b")}))
    assert other != base and moved.name == base.name and moved != base
    assert CountingRecipe.loads == 3


@pytest.mark.parametrize("where", ["/proc/raysim-cache", "a file/cache"])
def test_a_cache_dir_that_cannot_be_made_is_a_data_error_naming_the_key(counting, tmp_path, where):
    """/proc/raysim-cache used to end prepare in a FileNotFoundError traceback."""
    (tmp_path / "a file").write_text("")
    cache = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(DataError, match=f"dataset.cache_dir: the store folder {re.escape(cache)} cannot be"):
        prepare_store("test_counting", counting.model_copy(update={"cache_dir": cache}))
    assert CountingRecipe.loads == 0  # refused before the data is loaded


def test_base_config_gets_the_recipe_defaults(counting):
    base = DatasetConfig(cache_dir=counting.cache_dir, partition=NaturalPartition(column="speaker"))
    store = open_dataset("test_counting", base)
    assert store.meta["config"]["num_rows"] == 30
    assert [store.client_key(c) for c in range(store.num_clients)] == ["s0", "s1", "s2", "s3"]
    with pytest.raises(ConfigError, match="unknown dataset"):
        prepare_store("test_countin", base)


def test_failed_build_leaves_nothing(counting):
    config = counting.model_copy(update={"partition": NaturalPartition(column="user")})
    with pytest.raises(DataError, match="'user'"):
        prepare_store("test_counting", config)
    assert list(Path(counting.cache_dir).iterdir()) == []


def test_million_clients_open_small_and_read_only_their_rows(tmp_path):
    """2,000,000 rows in 1,000,000 clients of 2 (1 train + 1 test, test_fraction 0.5).

    Opening keeps three int64 numbers per client (24 MB); the budget is 200 MB. Reading clients
    slices the memory map, so Arrow allocates nothing and only their rows are decoded.
    """
    num_rows, num_clients = 2_000_000, 1_000_000
    part = Partition(order=np.arange(num_rows), sizes=np.full(num_clients, 2))
    write_store(row_id_examples(num_rows), part, 0.5, seed=0, path=tmp_path)

    tracemalloc.start()
    arrow_before = pa.total_allocated_bytes()
    store = ClientStore.open(tmp_path)
    _, peak_python = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept_by_arrow = pa.total_allocated_bytes() - arrow_before
    opened = peak_python + kept_by_arrow
    assert store.num_clients == num_clients
    assert kept_by_arrow < 2**20  # the rows are memory-mapped, not read
    assert opened < 200 * 2**20, f"opening cost {opened / 2**20:.0f} MB"

    arrow_before = pa.total_allocated_bytes()
    for cid in (0, 123_456, 999_999):
        train, test = store.client_data(cid, "train"), store.client_data(cid, "test")
        assert sorted([*row_ids(train.arrays["x"]), *row_ids(test.arrays["x"])]) == [
            2 * cid,
            2 * cid + 1,
        ]
    assert pa.total_allocated_bytes() == arrow_before
    assert store.label_histogram(999_999).sum() == 1


def test_the_shuffle_by_blocks_of_clients_is_one_lexsort_of_them_all(monkeypatch):
    """Reference: every client at once, by client then by one draw of random keys (the stream
    ``SPLIT_STREAM`` of the store's seed); blocks of 3 clients must give the same order."""
    from raysim.data.format import SPLIT_STREAM
    from raysim.data.prepare import _shuffle_within_clients

    monkeypatch.setattr("raysim.data.prepare.BATCH_ROWS", 3)
    sizes = np.array([3, 0, 7, 1, 5, 2, 6, 4, 1, 7, 3, 6])
    part = Partition(order=np.random.default_rng(1).permutation(45), sizes=sizes)
    key = np.random.default_rng([4, SPLIT_STREAM]).random(45)
    expected = part.order[np.lexsort((key, np.repeat(np.arange(12), sizes)))]
    assert np.array_equal(_shuffle_within_clients(part, 4), expected)
