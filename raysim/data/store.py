"""The federated dataset: a client store on disk and the ``ClientStore`` that reads it.

A recipe (a file in ``datasets/``) turns raw data into ``Examples``; ``raysim.data.prepare``
partitions them once, offline, into a store directory (layout and split rule:
``raysim.data.format``), which ``ClientStore`` memory-maps and reads one client at a time.

Usage:
    store = ClientStore.open(prepare_store("mnist", MnistConfig()))
    data = store.client_data(7, "train")          # reads client 7's rows only
    data.arrays["x"].shape                        # (n, 1, 28, 28) float32, normalised
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from raysim import registry
from raysim.config.sections import AugmentConfig, PoisonConfig
from raysim.data.format import (
    CENTRAL_FILE,
    COUNTS_FILE,
    INDEX_FILE,
    META_FILE,
    ROWS_FILE,
    read_meta,
    rebuild_hint,
    split_sizes,
)
from raysim.data.integrity import check_sizes
from raysim.data.partition import IidPartition, PartitionConfig
from raysim.errors import DataError
from raysim.sampling import split_validation
from raysim.types import ClientData, DataSpec, Split


class DatasetConfig(BaseModel, frozen=True, extra="forbid"):
    """Settings common to every dataset recipe; each recipe's ``Config`` subclasses this.

    Attributes:
        partition: how rows are split into clients.
        test_fraction: share of each client's rows held out as its test split.
        seed: seeds the partition and the split; independent of the run seed, so that
            algorithms compare on one split.
        cache_dir: where stores are kept (default: $RAYSIM_CACHE, else ~/.cache/raysim). It does
            not change the store's content and is left out of its hash.
        augment: random crop and flip of image clients' training batches (None: off).
        poison: a backdoor on chosen clients' training batches (None: off).
        validation_fraction: share of each client's training rows set apart, per run seed, as its
            validation split (``ClientStore.with_validation``; logged as ``eval/validation/...``).
        stratify_test: each client's test split drawn class by class, so that it holds the
            client's labels in the proportions its train split does (the LSS code's split;
            ``raysim.data.client_split``); False: drawn at random.
    """

    partition: PartitionConfig = IidPartition(num_clients=100)
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0)
    cache_dir: str | None = None
    augment: AugmentConfig | None = None
    poison: PoisonConfig | None = None
    validation_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    # Left out of dumps when off: the store cache path hashes the dump, and stores prepared
    # before this option existed must keep theirs.
    stratify_test: bool = Field(False, exclude_if=lambda value: not value)


# Options that leave the store's content alone: left out of its hash (``raysim.data.prepare``).
NOT_STORED = frozenset({"cache_dir", "augment", "poison", "validation_fraction"})


registry.require_config_base("dataset", DatasetConfig)  # every store is partitioned and cached alike


@dataclass(frozen=True)
class Examples:
    """What a recipe's ``load_examples`` returns: every row before partitioning.

    Attributes:
        table: column ``x`` (fixed_size_list of uint8 or float32 for flattened images, list<int>
            for tokens), ``y`` (int64) and any key columns used by partitioners; optionally
            ``is_test`` (bool), a split the source fixes (each client's test split is then its
            ``is_test`` rows, and ``test_fraction`` is not used).
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


class ClientStore:
    """Reads a client store: one client's rows on demand, from a memory map.

    Opening reads no per-client data: offsets and counts are a memory map of ``counts.npy``
    (``open_counts``; a store prepared before it holds them in memory, 24 bytes per client), rows
    are paged in only when a client is read, and keys and label histograms only when asked for.
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
        spec = meta["spec"]  # JSON lists back to the tuples DataSpec holds
        self.spec = DataSpec(
            **{**spec, "input_shape": tuple(spec["input_shape"]), "metrics": tuple(spec.get("metrics", ()))}
        )
        self.mean = None if meta["mean"] is None else tuple(meta["mean"])
        self.std = None if meta["std"] is None else tuple(meta["std"])
        self._meta = meta
        self._rows = rows
        self._offset = counts["offset"]  # (num_clients,) int64 each: the whole index
        self._num_train = counts["num_train"]
        self._num_test = counts["num_test"]
        self._index: pq.ParquetFile | None = None  # opened on the first key / histogram lookup
        self._central: pa.Table | None = None
        self._validation: tuple[float, int] | None = None  # (fraction, seed): with_validation
        self._num_validation = np.zeros_like(self._num_train)

    @classmethod
    def open(cls, path: str | Path) -> ClientStore:
        """Opens the store in directory ``path``.

        Raises:
            DataError: the directory is missing, incomplete, corrupt or of another format version.
        """
        path = Path(path)
        meta = read_meta(path)
        check_sizes(path, meta)  # a stat per file; ``verify_store`` hashes them
        try:
            rows = map_arrow(path / ROWS_FILE)
            counts, end = open_counts(path)
        except (OSError, pa.ArrowException, KeyError) as e:  # KeyError: an index without its columns
            raise DataError(f"client store {path} is unreadable ({e}); {rebuild_hint(path, meta)}") from e
        if len(counts["offset"]) != meta["num_clients"] or end > rows.num_rows:
            raise DataError(
                f"client store {path}: {INDEX_FILE} does not match {ROWS_FILE}; {rebuild_hint(path, meta)}"
            )
        try:
            return cls(path, meta, rows, counts)
        except (TypeError, KeyError, ValueError) as e:  # a spec, mean or std of the wrong shape
            raise DataError(
                f"client store {path}: {META_FILE} is malformed ({e!r}); {rebuild_hint(path, meta)}"
            ) from e

    def __reduce__(self) -> tuple:
        return (_reopen, (str(self.path), self._validation))

    def with_validation(self, fraction: float, seed: int) -> ClientStore:
        """This store with ``fraction`` of each client's training rows set apart as its
        ``validation`` split (rounded as the test split is, at least one training row kept), a
        choice per client seeded by ``seed`` (``raysim.sampling.split_validation``); the store
        itself when ``fraction`` is 0. The ``train`` split is then the rest, in stored order."""
        if fraction == 0:
            return self
        view = copy.copy(self)
        view._validation = (fraction, seed)
        _, view._num_validation = split_sizes(self._num_train, fraction)
        view._num_validation.flags.writeable = False
        return view

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
        if split == "validation":
            return self._num_validation
        if split not in ("train", "test"):
            raise DataError(f"split must be 'train', 'validation' or 'test', got {split!r}")
        if split == "train" and self._validation is not None:
            trained = self._num_train - self._num_validation
            trained.flags.writeable = False
            return trained
        return self._num_train if split == "train" else self._num_test

    def client_data(self, client_id: int, split: Split = "train") -> ClientData:
        """One client's examples of ``split``; touches only that client's rows of the memory map."""
        cid = self._check_id(client_id)
        if split == "validation" and self._validation is None:
            raise DataError("split 'validation' needs dataset.validation_fraction > 0 (e.g. 0.1)")
        if self._validation is not None and split != "test":
            stored = self._rows.slice(int(self._offset[cid]), int(self._num_train[cid]))
            _, seed = self._validation
            train, validation = split_validation(len(stored), int(self._num_validation[cid]), seed, cid)
            return self._decode(stored.take(validation if split == "validation" else train))
        start = int(self._offset[cid]) + (0 if split == "train" else int(self._num_train[cid]))
        return self._decode(self._rows.slice(start, int(self.num_examples(split)[cid])))

    def first_rows(self, n: int) -> ClientData:
        """The store's first ``n`` rows (or all, if fewer), decoded like a client's: a batch shaped
        like the data, to check a model against before training."""
        return self._decode(self._rows.slice(0, min(n, self._rows.num_rows)))

    def central_test(self) -> ClientData | None:
        """The central test set, or None when the recipe has none."""
        if not self._meta["has_central_test"]:
            return None
        if self._central is None:
            self._central = map_arrow(self.path / CENTRAL_FILE)
        return self._decode(self._central)

    def label_histogram(self, client_id: int) -> np.ndarray:
        """(num_classes,) int64 label counts of the client's train rows."""
        if not self._meta["has_label_hist"]:
            raise DataError(f"client store {self.path} has no label histograms (no labels)")
        return self._index_cell("label_hist", self._check_id(client_id)).values.to_numpy().astype(np.int64)

    def client_key(self, client_id: int) -> str:
        """The client's natural id or domain name; its id as text when the partition has none."""
        cid = self._check_id(client_id)
        key = self._index_cell("key", cid).as_py()
        return str(cid) if key is None else key

    def _check_id(self, client_id: int) -> int:
        cid = operator.index(client_id)
        if not 0 <= cid < self.num_clients:
            raise DataError(f"client_id {cid} is out of range [0, {self.num_clients}) for {self.path}")
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
        channel when the store has mean/std), other integers (tokens) to int64; labels to int64,
        or float32 for regression targets."""
        x = _column_values(rows.column("x"), self.spec, rows.num_rows)
        if x.dtype == np.uint8:
            x = x.astype(np.float32)
            x /= 255
        else:  # x is already a fresh copy: convert without another one
            x = x.astype(np.float32 if np.issubdtype(x.dtype, np.floating) else np.int64, copy=False)
        if self.mean is not None and x.dtype == np.float32:
            shape = (1, -1) + (1,) * (x.ndim - 2)  # broadcast over (n, C, ...)
            x -= np.asarray(self.mean, np.float32).reshape(shape)
            x /= np.asarray(self.std, np.float32).reshape(shape)
        arrays = {"x": x}
        if "y" in rows.column_names:
            y = rows.column("y")
            dtype = np.float32 if pa.types.is_floating(y.type) else np.int64
            arrays["y"] = _concat([c.to_numpy() for c in y.chunks], dtype).astype(dtype, copy=False)
        return ClientData(arrays)


COUNT_COLUMNS = ("offset", "num_train", "num_test")


def open_counts(path: Path) -> tuple[dict[str, np.ndarray], int]:
    """The store's ``COUNT_COLUMNS`` as read-only int64 arrays, and the end of the last row used.

    A memory map of ``counts.npy``: nothing is read until a client's entries are, so the driver of
    a ten-million-client run does not hold 240 MB of counts (nor do its workers, each again).
    Clients' rows are contiguous and in order, so the last client's end is the end of all.
    Stores prepared before ``counts.npy`` fall back to ``read_counts``.
    """
    if not (path / COUNTS_FILE).is_file():
        return read_counts(path / INDEX_FILE)
    table = np.asarray(np.load(path / COUNTS_FILE, mmap_mode="r"))  # a plain ndarray over the map
    if table.dtype != np.int64 or table.ndim != 2 or len(table) != len(COUNT_COLUMNS):
        raise KeyError(f"{COUNTS_FILE} holds {table.dtype} {table.shape}, not (3, num_clients) int64")
    counts = dict(zip(COUNT_COLUMNS, table))
    end = int(table[:, -1].sum()) if table.shape[1] else 0
    return counts, end


def read_counts(path: Path) -> tuple[dict[str, np.ndarray], int]:
    """The index's ``COUNT_COLUMNS`` as read-only int64 arrays, and the end of the last row used.

    Read one row group at a time into arrays allocated once, so that opening costs the arrays
    (24 bytes per client) plus what a process's first parquet read costs (~40 MB): a whole-table
    read followed by a copy out of Arrow peaked at 4-5 times the arrays (``tests/store_memory.py``:
    +770 MB against +290 MB now, for ten million clients).
    """
    with pq.ParquetFile(path, pre_buffer=False) as index:
        num_clients = index.metadata.num_rows
        counts = {name: np.empty(num_clients, np.int64) for name in COUNT_COLUMNS}
        start, end = 0, 0
        for group in range(index.metadata.num_row_groups):
            table = index.read_row_group(group, columns=list(COUNT_COLUMNS), use_threads=False)
            stop = start + table.num_rows
            for name, array in counts.items():
                array[start:stop] = table.column(name).to_numpy()
            if stop > start:  # per row group: no temporary the size of the index
                ends = (
                    counts["offset"][start:stop]
                    + counts["num_train"][start:stop]
                    + counts["num_test"][start:stop]
                )
                end = max(end, int(ends.max()))
            start = stop
    for array in counts.values():
        array.flags.writeable = False
    return counts, end


def _column_values(column: pa.ChunkedArray, spec: DataSpec, num_rows: int) -> np.ndarray:
    """(n, *spec.input_shape) values of column ``x``; variable-length token lists are padded."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return _pad_tokens(column, spec.input_shape[0], spec.pad_token_id or 0)
    values = [
        c.flatten().to_numpy() if pa.types.is_fixed_size_list(c.type) else c.to_numpy() for c in column.chunks
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


def map_arrow(path: Path) -> pa.Table:
    """Zero-copy table over a memory-mapped Arrow IPC file: reading it allocates nothing."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def _reopen(path: str, validation: tuple[float, int] | None) -> ClientStore:
    """A store unpickled in another process: reopened, with its validation split."""
    store = ClientStore.open(path)
    return store if validation is None else store.with_validation(*validation)
