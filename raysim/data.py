"""The federated dataset: a client store on disk and the ``ClientStore`` that reads it.

A recipe (a file in ``datasets/``) turns raw data into ``Examples``; ``prepare_store`` partitions
them once, offline, and writes one directory:

    rows.arrow          Arrow IPC file, uncompressed so it can be memory-mapped: every client's
                        rows contiguous (client 0 first), its train rows then its test rows
    clients.parquet     client_id, key, offset, num_train, num_test[, label_hist (train rows)]
    central_test.arrow  optional central test set, same columns as rows.arrow
    meta.json           format version, spec, counts, mean/std, recipe + config, content hash

Per-client split rule: a client with n rows keeps ``num_test = min(floor(n * test_fraction + 1/2),
n - 1)`` rows for test (round half up, but never its last train row) and ``n - num_test`` for
train, after a seeded shuffle of its rows.

Usage:
    store = open_dataset("mnist", MnistConfig(partition=DirichletPartition(alpha=0.3)))
    data = store.client_data(7, "train")          # reads client 7's rows only
    data.arrays["x"].shape                        # (n, 1, 28, 28) float32, normalised
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, ValidationError

from raysim import registry
from raysim.errors import ConfigError, DataError
from raysim.partition import IidPartition, Partition, PartitionConfig, partition
from raysim.types import ClientData, DataSpec, Split

FORMAT_VERSION = 1
ROWS_FILE = "rows.arrow"
INDEX_FILE = "clients.parquet"
CENTRAL_FILE = "central_test.arrow"
META_FILE = "meta.json"
BATCH_ROWS = 65_536  # record batches of rows.arrow and row groups of clients.parquet
_REQUIRED_META = ("spec", "num_clients", "mean", "std", "has_central_test", "has_label_hist")
# The train/test shuffle draws from its own stream, independent of the partition's.
_SPLIT_STREAM = 1


class DatasetConfig(BaseModel, frozen=True, extra="forbid"):
    """Settings common to every dataset recipe; each recipe's ``Config`` subclasses this.

    Attributes:
        partition: how rows are split into clients.
        test_fraction: share of each client's rows held out as its test split.
        seed: seeds the partition and the split; independent of the run seed, so that
            algorithms compare on one split.
        cache_dir: where stores are kept (default: $RAYSIM_CACHE, else ~/.cache/raysim). It does
            not change the store's content and is left out of its hash.
    """

    partition: PartitionConfig = IidPartition(num_clients=100)
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0)
    cache_dir: str | None = None


@dataclass(frozen=True)
class Examples:
    """What a recipe's ``load_examples`` returns: every row before partitioning.

    Attributes:
        table: column ``x`` (fixed_size_list of uint8 or float32 for flattened images, list<int>
            for tokens), ``y`` (int64) and any key columns used by partitioners.
        spec: shapes and classes the model is built for.
        central_test: optional central test set with columns ``x`` and ``y``.
        mean: per-channel mean applied at read time (images on the [0, 1] scale), or None.
        std: per-channel std applied at read time, or None.
    """

    table: pa.Table
    spec: DataSpec
    central_test: pa.Table | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


def image_table(images: np.ndarray, labels: np.ndarray, **columns: Any) -> pa.Table:
    """Builds an ``Examples.table`` from (n, C, H, W) images, (n,) labels and extra key columns."""
    flat = pa.array(np.ascontiguousarray(images).reshape(-1))
    x = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(images.shape[1:])))
    return pa.table({"x": x, "y": pa.array(np.asarray(labels, np.int64)), **columns})


def channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of (n, C, H, W) uint8 images on the [0, 1] scale.

    Exact and cheap in memory: computed from a 256-bin histogram per channel, never as float64.
    """
    levels = np.arange(256) / 255.0
    means, stds = [], []
    for channel in range(images.shape[1]):
        hist = np.bincount(images[:, channel].ravel(), minlength=256)
        p = hist / hist.sum()
        mean = float(p @ levels)
        means.append(mean)
        stds.append(float(np.sqrt(p @ (levels - mean) ** 2)))
    return tuple(means), tuple(stds)


def partition_table(config: PartitionConfig, table: pa.Table, seed: int) -> Partition:
    """Runs the partitioner on a table's ``y`` and ``config.column`` (if the config has one)."""
    labels = table.column("y").to_numpy() if "y" in table.column_names else None
    column = getattr(config, "column", None)
    keys = None
    if column is not None:
        if column not in table.column_names:
            raise DataError(
                f"partition.column {column!r} is not a column of the dataset "
                f"(columns: {', '.join(table.column_names)})"
            )
        if table.column(column).null_count:
            raise DataError(f"partition.column {column!r} has missing values")
        keys = table.column(column).to_numpy()
    return partition(config, labels, keys, seed, num_rows=table.num_rows)


def split_sizes(sizes: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(num_train, num_test) per client by the rule in the module docstring."""
    num_test = np.floor(sizes * test_fraction + 0.5).astype(np.int64)
    num_test = np.minimum(num_test, np.maximum(sizes - 1, 0))
    return sizes - num_test, num_test


def write_store(
    examples: Examples,
    partition: Partition,
    test_fraction: float,
    seed: int,
    path: str | Path,
    *,
    source: dict[str, Any] | None = None,
) -> Path:
    """Writes a client store (layout in the module docstring) into the directory ``path``.

    Args:
        examples: every row, as a recipe returns them.
        partition: which source rows each client holds.
        test_fraction: share of each client's rows held out as its test split.
        seed: seeds the per-client train/test shuffle.
        path: the directory to write; created if needed.
        source: what the store was built from (recipe name, config), recorded in meta.json.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _check_examples(examples, partition)
    order = _shuffle_within_clients(partition, seed)
    _write_arrow(examples.table, order, path / ROWS_FILE)
    index = _client_index(examples, partition, order, test_fraction)
    pq.write_table(index, path / INDEX_FILE, row_group_size=BATCH_ROWS)
    if examples.central_test is not None:
        _write_arrow(examples.central_test, None, path / CENTRAL_FILE)
    meta = {
        "format_version": FORMAT_VERSION,
        **(source or {}),
        "spec": asdict(examples.spec),
        "num_clients": partition.num_clients,
        "num_rows": len(order),
        "test_fraction": test_fraction,
        "seed": seed,
        "mean": examples.mean,
        "std": examples.std,
        "has_central_test": examples.central_test is not None,
        "has_label_hist": "label_hist" in index.column_names,
        "content_hash": _content_hash(path),
    }
    (path / META_FILE).write_text(json.dumps(meta, indent=2))  # last: marks the store complete
    return path


def _shuffle_within_clients(partition: Partition, seed: int) -> np.ndarray:
    """``partition.order`` with each client's rows in a seeded random order (train rows first)."""
    client_of_row = np.repeat(np.arange(partition.num_clients), partition.sizes)
    shuffle_key = np.random.default_rng([seed, _SPLIT_STREAM]).random(len(partition.order))
    # One lexsort shuffles every client at once: by client, then by the random key.
    return partition.order[np.lexsort((shuffle_key, client_of_row))]


def _client_index(
    examples: Examples, partition: Partition, order: np.ndarray, test_fraction: float
) -> pa.Table:
    """The clients.parquet table; label histograms count each client's train rows."""
    num_clients, sizes = partition.num_clients, partition.sizes
    num_train, num_test = split_sizes(sizes, test_fraction)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    keys = partition.keys
    index = {
        "client_id": pa.array(np.arange(num_clients, dtype=np.int64)),
        "key": pa.nulls(num_clients, pa.string()) if keys is None else pa.array(keys, pa.string()),
        "offset": pa.array(offsets),
        "num_train": pa.array(num_train),
        "num_test": pa.array(num_test),
    }
    if "y" in examples.table.column_names and examples.spec.task == "classification":
        is_train = np.arange(len(order)) - np.repeat(offsets, sizes) < np.repeat(num_train, sizes)
        clients = np.repeat(np.arange(num_clients), sizes)[is_train]
        labels = examples.table.column("y").to_numpy()[order][is_train]
        index["label_hist"] = _label_hist(clients, labels, num_clients, examples.spec.num_classes)
    return pa.table(index)


def _check_examples(examples: Examples, partition: Partition) -> None:
    table, spec = examples.table, examples.spec
    if "x" not in table.column_names:
        raise DataError(f"examples need an 'x' column (columns: {', '.join(table.column_names)})")
    x_type = table.schema.field("x").type
    if pa.types.is_fixed_size_list(x_type) and x_type.list_size != int(np.prod(spec.input_shape)):
        raise DataError(
            f"'x' holds {x_type.list_size} values per row but spec.input_shape is "
            f"{spec.input_shape}"
        )
    order = partition.order
    if len(order) and (order.min() < 0 or order.max() >= table.num_rows):
        raise DataError(f"partition refers to rows outside the table's {table.num_rows} rows")
    if len(order) and np.bincount(order, minlength=table.num_rows).max() > 1:
        raise DataError("partition uses some rows more than once")
    if "y" in table.column_names and spec.task == "classification" and table.num_rows:
        low, high = pc.min_max(table.column("y")).values()
        if low.as_py() < 0 or high.as_py() >= spec.num_classes:
            raise DataError(
                f"labels span [{low}, {high}], outside [0, spec.num_classes={spec.num_classes})"
            )


def _write_arrow(table: pa.Table, order: np.ndarray | None, path: Path) -> None:
    """Writes ``table.take(order)`` (or ``table``) in record batches, one in memory at a time."""
    # Uncompressed on purpose: compressed IPC buffers cannot be memory-mapped zero-copy.
    with pa.ipc.new_file(path, table.schema) as writer:
        if order is None:
            writer.write_table(table, max_chunksize=BATCH_ROWS)
            return
        for start in range(0, len(order), BATCH_ROWS):
            rows = table.take(order[start : start + BATCH_ROWS])
            writer.write_table(rows, max_chunksize=BATCH_ROWS)


def _label_hist(
    clients: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int
) -> pa.Array:
    """list<int32> of per-client label counts, from one bincount over (client, label) pairs."""
    counts = np.bincount(clients * num_classes + labels, minlength=num_clients * num_classes)
    list_offsets = pa.array(
        np.arange(0, num_clients * num_classes + 1, num_classes, dtype=np.int32)
    )
    return pa.ListArray.from_arrays(list_offsets, pa.array(counts.astype(np.int32)))


def _content_hash(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name in (ROWS_FILE, INDEX_FILE, CENTRAL_FILE):
        if (path / name).is_file():
            with open(path / name, "rb") as f:
                digest.update(hashlib.file_digest(f, "blake2b").digest())
    return digest.hexdigest()


def store_path(recipe_name: str, config: DatasetConfig) -> Path:
    """``<cache>/<recipe>-<hash>``: the hash covers the format version, recipe name and config."""
    root = config.cache_dir or os.environ.get("RAYSIM_CACHE") or Path.home() / ".cache" / "raysim"
    text = f"{FORMAT_VERSION}\0{recipe_name}\0{config.model_dump_json(exclude={'cache_dir'})}"
    return (
        Path(root).expanduser() / f"{recipe_name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    )


def prepare_store(recipe_name: str, config: DatasetConfig) -> Path:
    """Builds the store of ``recipe_name`` under ``config`` once and returns its directory.

    An existing complete store is reused without loading the recipe's data. A new one is built in
    a temporary directory and renamed into place, so a crash never leaves a half store behind and
    concurrent builders agree on one result.

    Raises:
        ConfigError: unknown recipe or a config the recipe rejects.
        DataError: the data cannot be partitioned or written as asked.
    """
    entry = registry.get("dataset", recipe_name)
    config = _as_recipe_config(entry.config, config)
    path = store_path(recipe_name, config)
    if (path / META_FILE).is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        examples = entry.factory(config).load_examples()
        part = partition_table(config.partition, examples.table, config.seed)
        source = {
            "recipe": recipe_name,
            "config": config.model_dump(mode="json", exclude={"cache_dir"}),
        }
        write_store(examples, part, config.test_fraction, config.seed, tmp, source=source)
        _publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _as_recipe_config(config_type: type[BaseModel], config: DatasetConfig) -> DatasetConfig:
    """Accepts a recipe's own config, or a base one completed with the recipe's defaults."""
    if isinstance(config, config_type):
        return config
    try:
        return config_type.model_validate(config.model_dump())
    except ValidationError as e:
        raise ConfigError(
            [f"dataset.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        ) from None


def _publish(tmp: Path, path: Path) -> None:
    try:
        os.rename(tmp, path)
    except OSError:
        if not (path / META_FILE).is_file():
            raise DataError(
                f"{path} exists but is not a complete store; delete it and retry"
            ) from None
        # Another process published the same store first; theirs is identical, keep it.


class ClientStore:
    """Reads a client store: one client's rows on demand, from a memory map.

    Opening costs O(num_clients) small integers (offsets and counts as numpy int64); rows are
    paged in only when a client is read, and keys and label histograms only when asked for.
    Pickling sends only the path: the receiving Ray worker reopens the store.

    Usage:
        store = ClientStore.open(prepare_store("digits", DigitsConfig()))
        data = store.client_data(0, "train")
        x, y = data.arrays["x"], data.arrays["y"]
    """

    def __init__(
        self, path: Path, meta: dict[str, Any], rows: pa.Table, counts: dict[str, np.ndarray]
    ) -> None:
        """Use ``ClientStore.open``."""
        self.path = path
        self.spec = DataSpec(**{**meta["spec"], "input_shape": tuple(meta["spec"]["input_shape"])})
        self.mean = None if meta["mean"] is None else tuple(meta["mean"])
        self.std = None if meta["std"] is None else tuple(meta["std"])
        self._meta = meta
        self._rows = rows
        self._offset = counts["offset"]  # (num_clients,) int64 each: the whole in-memory index
        self._num_train = counts["num_train"]
        self._num_test = counts["num_test"]
        self._index: pq.ParquetFile | None = None  # opened on the first key / histogram lookup
        self._central: pa.Table | None = None

    @classmethod
    def open(cls, path: str | Path) -> ClientStore:
        """Opens the store in directory ``path``.

        Raises:
            DataError: the directory is missing, incomplete, corrupt or of another format version.
        """
        path = Path(path)
        meta = _read_meta(path)
        try:
            rows = _map_arrow(path / ROWS_FILE)
            index = pq.read_table(path / INDEX_FILE, columns=["offset", "num_train", "num_test"])
        except (OSError, pa.ArrowException) as e:
            raise DataError(
                f"client store {path} is unreadable ({e}); delete it and prepare it again"
            ) from e
        # Copied out of Arrow so that the parquet buffers are freed when ``index`` goes.
        counts = {
            name: index.column(name).to_numpy().astype(np.int64) for name in index.column_names
        }
        for array in counts.values():
            array.flags.writeable = False
        ends = counts["offset"] + counts["num_train"] + counts["num_test"]
        if len(ends) != meta["num_clients"] or (len(ends) and ends.max() > rows.num_rows):
            raise DataError(
                f"client store {path}: {INDEX_FILE} does not match {ROWS_FILE}; "
                "delete it and prepare it again"
            )
        return cls(path, meta, rows, counts)

    def __reduce__(self) -> tuple:
        return (type(self).open, (str(self.path),))

    def __repr__(self) -> str:
        return f"ClientStore({str(self.path)!r}, num_clients={self.num_clients})"

    @property
    def num_clients(self) -> int:
        return len(self._offset)

    @property
    def meta(self) -> dict[str, Any]:
        """The store's meta.json: recipe, config, counts, content hash."""
        return dict(self._meta)

    def num_examples(self, split: Split = "train") -> np.ndarray:
        """Rows per client of ``split``, a read-only (num_clients,) int64 array."""
        if split not in ("train", "test"):
            raise DataError(f"split must be 'train' or 'test', got {split!r}")
        return self._num_train if split == "train" else self._num_test

    def client_data(self, client_id: int, split: Split = "train") -> ClientData:
        """One client's examples of ``split``; touches only that client's rows of the memory map."""
        cid = self._check_id(client_id)
        start = int(self._offset[cid]) + (0 if split == "train" else int(self._num_train[cid]))
        return self._decode(self._rows.slice(start, int(self.num_examples(split)[cid])))

    def central_test(self) -> ClientData | None:
        """The central test set, or None when the recipe has none."""
        if not self._meta["has_central_test"]:
            return None
        if self._central is None:
            self._central = _map_arrow(self.path / CENTRAL_FILE)
        return self._decode(self._central)

    def label_histogram(self, client_id: int) -> np.ndarray:
        """(num_classes,) int64 label counts of the client's train rows."""
        if not self._meta["has_label_hist"]:
            raise DataError(f"client store {self.path} has no label histograms (no labels)")
        return (
            self._index_cell("label_hist", self._check_id(client_id))
            .values.to_numpy()
            .astype(np.int64)
        )

    def client_key(self, client_id: int) -> str:
        """The client's natural id or domain name; its id as text when the partition has none."""
        cid = self._check_id(client_id)
        key = self._index_cell("key", cid).as_py()
        return str(cid) if key is None else key

    def _check_id(self, client_id: int) -> int:
        cid = operator.index(client_id)
        if not 0 <= cid < self.num_clients:
            raise DataError(
                f"client_id {cid} is out of range [0, {self.num_clients}) for {self.path}"
            )
        return cid

    def _index_cell(self, column: str, cid: int) -> pa.Scalar:
        """One cell of clients.parquet, reading only the row group that holds it."""
        if self._index is None:
            self._index = pq.ParquetFile(self.path / INDEX_FILE)
        group, first = 0, 0
        while cid >= first + self._index.metadata.row_group(group).num_rows:
            first += self._index.metadata.row_group(group).num_rows
            group += 1
        return self._index.read_row_group(group, columns=[column]).column(0)[cid - first]

    def _decode(self, rows: pa.Table) -> ClientData:
        """Rows -> numpy: uint8 images to float32/255, floats to float32 (both normalised per
        channel when the store has mean/std), other integers (tokens) to int64."""
        x = _column_values(rows.column("x"), self.spec, rows.num_rows)
        if x.dtype == np.uint8:
            x = x.astype(np.float32)
            x /= 255
        else:  # x is already a fresh copy: convert without another one
            x = x.astype(
                np.float32 if np.issubdtype(x.dtype, np.floating) else np.int64, copy=False
            )
        if self.mean is not None and x.dtype == np.float32:
            shape = (1, -1) + (1,) * (x.ndim - 2)  # broadcast over (n, C, ...)
            x -= np.asarray(self.mean, np.float32).reshape(shape)
            x /= np.asarray(self.std, np.float32).reshape(shape)
        arrays = {"x": x}
        if "y" in rows.column_names:
            labels = _concat([c.to_numpy() for c in rows.column("y").chunks], np.int64)
            arrays["y"] = labels.astype(np.int64, copy=False)
        return ClientData(arrays)


def _column_values(column: pa.ChunkedArray, spec: DataSpec, num_rows: int) -> np.ndarray:
    """(n, *spec.input_shape) values of column ``x``; variable-length token lists are padded."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return _pad_tokens(column, spec.input_shape[0], spec.pad_token_id or 0)
    values = [
        c.flatten().to_numpy() if pa.types.is_fixed_size_list(c.type) else c.to_numpy()
        for c in column.chunks
    ]
    leaf = column.type.value_type if pa.types.is_fixed_size_list(column.type) else column.type
    return _concat(values, leaf.to_pandas_dtype()).reshape(num_rows, *spec.input_shape)


def _pad_tokens(column: pa.ChunkedArray, length: int, pad: int) -> np.ndarray:
    """(n, length) tokens: each row truncated or right-padded with ``pad``."""
    lengths = _concat([pc.list_value_length(c).to_numpy() for c in column.chunks], np.int64)
    values = _concat([c.flatten().to_numpy() for c in column.chunks], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    positions = np.arange(length)
    is_token = positions < np.minimum(lengths, length)[:, None]
    out = np.full((len(lengths), length), pad, dtype=np.int64)
    out[is_token] = values[(starts[:, None] + positions)[is_token]]
    return out


def _concat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """Concatenates chunk views into one fresh, writable array (the memory map stays read-only)."""
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def _map_arrow(path: Path) -> pa.Table:
    """Zero-copy table over a memory-mapped Arrow IPC file: reading it allocates nothing."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise DataError(f"no client store at {path} (not a directory); prepare it first")
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(
            f"client store {path} has no readable {META_FILE} ({e}); delete it and prepare it again"
        ) from e
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise DataError(
            f"client store {path} has format version {version!r}, this raysim reads "
            f"{FORMAT_VERSION}; delete it and prepare it again"
        )
    missing = [key for key in _REQUIRED_META if key not in meta]
    if missing:
        raise DataError(
            f"client store {path}: {META_FILE} lacks {', '.join(missing)}; "
            "delete it and prepare it again"
        )
    return meta


def open_dataset(recipe_name: str, config: DatasetConfig) -> ClientStore:
    """Prepares the store if needed and opens it: ``ClientStore.open(prepare_store(...))``."""
    return ClientStore.open(prepare_store(recipe_name, config))
