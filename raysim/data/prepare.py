"""Writing client stores: partition a recipe's examples once, offline, and cache the result.

``prepare_store`` is idempotent: the store's directory is named by a hash of the recipe and its
config, built in a temporary directory and renamed into place when complete. The layout and the
per-client train/test split rule are described in ``raysim.data.format``.

Usage:
    path = prepare_store("mnist", MnistConfig())        # builds once, then returns the cache
    store = ClientStore.open(path)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from raysim import registry
from raysim.data.client_split import choose_test_rows, num_test_rows
from raysim.data.format import (
    BATCH_ROWS,
    CENTRAL_FILE,
    COUNTS_FILE,
    FORMAT_VERSION,
    INDEX_FILE,
    ROWS_FILE,
    SPLIT_STREAM,
    default_cache_root,
    is_complete,
    write_meta,
)
from raysim.data.integrity import FULL_CHECK_BYTES, store_bytes, verify_store
from raysim.data.partition import Partition, PartitionConfig, partition
from raysim.data.store import NOT_STORED, ClientStore, DatasetConfig, Examples
from raysim.errors import ConfigError, DataError

_INT32_MAX = 2**31 - 1


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


def write_store(
    examples: Examples,
    partition: Partition,
    test_fraction: float,
    seed: int,
    path: str | Path,
    *,
    source: dict[str, Any] | None = None,
    stratify: bool = False,
) -> Path:
    """Writes a client store (layout in the module docstring) into the directory ``path``.

    Args:
        examples: every row, as a recipe returns them.
        partition: which source rows each client holds.
        test_fraction: share of each client's rows held out as its test split.
        seed: seeds the per-client train/test shuffle.
        path: the directory to write; created if needed.
        source: what the store was built from (recipe name, config), recorded in meta.json.
        stratify: draw each client's test rows class by class
            (``raysim.data.client_split.stratified_test_rows``). A table with an ``is_test``
            column fixes the split instead, and ``test_fraction`` is not used.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _check_examples(examples, partition)
    is_test = choose_test_rows(examples.table, examples.spec, partition, test_fraction, seed, stratify)
    order = _shuffle_within_clients(partition, seed, is_test)
    num_test = num_test_rows(partition, order, is_test, test_fraction)
    _write_arrow(examples.table, order, path / ROWS_FILE)
    has_label_hist = _write_client_index(examples, partition, order, num_test, path)
    if examples.central_test is not None:
        _write_arrow(examples.central_test, None, path / CENTRAL_FILE)
    write_meta(
        path,
        {  # last: marks the store complete
            **(source or {}),
            "spec": asdict(examples.spec),
            "num_clients": partition.num_clients,
            "num_rows": len(order),
            "test_fraction": test_fraction,
            "seed": seed,
            "mean": examples.mean,
            "std": examples.std,
            "has_central_test": examples.central_test is not None,
            "has_label_hist": has_label_hist,
            **_token_range(examples),
        },
        extra_files=(COUNTS_FILE,),
    )
    return path


def _token_range(examples: Examples) -> dict[str, int]:
    """``{"max_token_id": ...}`` for token inputs (integers other than uint8 pixels), so that a
    model's vocabulary can be checked against the data before training; else ``{}``."""
    column_type = examples.table.schema.field("x").type
    leaf = getattr(column_type, "value_type", column_type)  # list types: their values' type
    if not pa.types.is_integer(leaf) or pa.types.is_uint8(leaf):
        return {}
    tables = [t for t in (examples.table, examples.central_test) if t is not None]
    values = [t.column("x") if leaf is column_type else pc.list_flatten(t.column("x")) for t in tables]
    highest = [h for h in (pc.max(v).as_py() for v in values) if h is not None]
    return {"max_token_id": int(max(highest))} if highest else {}


def _shuffle_within_clients(partition: Partition, seed: int, is_test: np.ndarray | None = None) -> np.ndarray:
    """``partition.order`` with each client's rows in a seeded random order (train rows first:
    with ``is_test``, the rows it marks go last).

    By client, then by a random key: one lexsort per block of whole clients (``_client_blocks``),
    so that the temporaries are a block's, not the population's; the keys are drawn block after
    block from one stream, which gives the numbers one draw of them all would.
    """
    rng = np.random.default_rng([seed, SPLIT_STREAM])
    order = np.empty_like(partition.order)
    for first, last, start, stop in _client_blocks(partition.sizes):
        client_of_row = np.repeat(np.arange(first, last), partition.sizes[first:last])
        shuffle_key = rng.random(stop - start)
        rows = partition.order[start:stop]
        keys = (
            (shuffle_key, client_of_row) if is_test is None else (shuffle_key, is_test[rows], client_of_row)
        )
        order[start:stop] = rows[np.lexsort(keys)]
    return order


def _client_blocks(sizes: np.ndarray) -> Iterator[tuple[int, int, int, int]]:
    """(first client, last client + 1, first row, last row + 1) of blocks of ``BATCH_ROWS`` clients."""
    start = 0
    for first in range(0, max(len(sizes), 1), BATCH_ROWS):  # one block, empty, for no clients
        last = min(first + BATCH_ROWS, len(sizes))
        stop = start + int(sizes[first:last].sum())
        yield first, last, start, stop
        start = stop


def _write_client_index(
    examples: Examples, partition: Partition, order: np.ndarray, num_test: np.ndarray, path: Path
) -> bool:
    """Writes clients.parquet, one row group per block of clients (``_client_blocks``: a block's
    arrays at a time, never the population's), and counts.npy; returns whether the index has
    label histograms (of each client's train rows)."""
    labels = examples.table.column("y").to_numpy() if "y" in examples.table.column_names else None
    if examples.spec.task != "classification":
        labels = None
    counts = np.lib.format.open_memmap(path / COUNTS_FILE, "w+", np.int64, (3, partition.num_clients))
    counts_start = counts.offset
    del counts  # filled through the file: a map's dirty pages would count as resident memory
    writer: pq.ParquetWriter | None = None
    with open(path / COUNTS_FILE, "r+b") as counts_file:
        for span in _client_blocks(partition.sizes):
            block = _index_block(partition, order, labels, examples.spec.num_classes, num_test, span)
            for row, name in enumerate(("offset", "num_train", "num_test")):
                counts_file.seek(counts_start + 8 * (row * partition.num_clients + span[0]))
                counts_file.write(block[name].to_numpy().tobytes())
            table = pa.table(block)
            writer = writer or pq.ParquetWriter(path / INDEX_FILE, table.schema)
            writer.write_table(table, row_group_size=BATCH_ROWS)
    assert writer is not None  # _client_blocks yields a block even for no clients
    writer.close()
    return labels is not None


def _index_block(
    partition: Partition,
    order: np.ndarray,
    labels: np.ndarray | None,
    num_classes: int,
    num_test_of_client: np.ndarray,
    clients_and_rows: tuple[int, int, int, int],
) -> dict[str, pa.Array]:
    """The index's columns for one of ``_client_blocks``: clients ``first:last``, rows ``start:stop``."""
    first, last, start, stop = clients_and_rows
    sizes = partition.sizes[first:last]
    num_test = num_test_of_client[first:last]
    num_train = sizes - num_test
    offsets = start + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    block = {
        "client_id": pa.array(np.arange(first, last, dtype=np.int64)),
        "key": _keys(partition.keys, first, last),
        "offset": pa.array(offsets),
        "num_train": pa.array(num_train),
        "num_test": pa.array(num_test),
    }
    if labels is not None:
        is_train = np.arange(start, stop) - np.repeat(offsets, sizes) < np.repeat(num_train, sizes)
        clients = np.repeat(np.arange(last - first), sizes)[is_train]
        block["label_hist"] = _label_hist(
            clients, labels[order[start:stop]][is_train], last - first, num_classes
        )
    return block


def _keys(keys: list[str] | None, first: int, last: int) -> pa.Array:
    return pa.nulls(last - first, pa.string()) if keys is None else pa.array(keys[first:last], pa.string())


def _check_examples(examples: Examples, partition: Partition) -> None:
    table, spec = examples.table, examples.spec
    if "x" not in table.column_names:
        raise DataError(f"examples need an 'x' column (columns: {', '.join(table.column_names)})")
    x_type = table.schema.field("x").type
    if pa.types.is_fixed_size_list(x_type) and x_type.list_size != int(np.prod(spec.input_shape)):
        raise DataError(
            f"'x' holds {x_type.list_size} values per row but spec.input_shape is {spec.input_shape}"
        )
    order = partition.order
    if len(order) and (order.min() < 0 or order.max() >= table.num_rows):
        raise DataError(f"partition refers to rows outside the table's {table.num_rows} rows")
    is_used = np.zeros(table.num_rows, bool)  # a byte per row, not a count of 8
    is_used[order] = True
    if np.count_nonzero(is_used) < len(order):
        raise DataError("partition uses some rows more than once")
    if "y" in table.column_names and spec.task == "classification":
        _check_label_hist_limits(spec.num_classes, partition)
    if "y" in table.column_names and spec.task == "classification" and table.num_rows:
        low, high = pc.min_max(table.column("y")).values()
        if low.as_py() < 0 or high.as_py() >= spec.num_classes:
            raise DataError(f"labels span [{low}, {high}], outside [0, spec.num_classes={spec.num_classes})")


def _check_label_hist_limits(num_classes: int, partition: Partition) -> None:
    """clients.parquet's label histograms are list<int32>: a row group's offsets (its clients
    times the classes) and each count must stay under 2**31, or Arrow would wrap them silently."""
    clients_per_group = min(partition.num_clients, BATCH_ROWS)
    if clients_per_group * num_classes > _INT32_MAX:
        raise DataError(
            f"spec.num_classes: {num_classes:,} classes over {clients_per_group:,} clients (a row group of "
            f"{INDEX_FILE}) exceed the {_INT32_MAX:,} entries its label histograms can hold; at most "
            f"{_INT32_MAX // clients_per_group:,} classes"
        )
    if len(partition.sizes) and int(partition.sizes.max()) > _INT32_MAX:
        client = int(partition.sizes.argmax())
        raise DataError(
            f"partition: client {client} holds {int(partition.sizes[client]):,} rows, more than a label "
            f"histogram's int32 counts hold ({_INT32_MAX:,}); raise partition.num_clients"
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


def _label_hist(clients: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int) -> pa.Array:
    """list<int32> of per-client label counts, from one bincount over (client, label) pairs."""
    counts = np.bincount(clients * num_classes + labels, minlength=num_clients * num_classes)
    list_offsets = pa.array(np.arange(0, num_clients * num_classes + 1, num_classes, dtype=np.int32))
    return pa.ListArray.from_arrays(list_offsets, pa.array(counts.astype(np.int32)))


def store_path(recipe_name: str, config: DatasetConfig) -> Path:
    """``<cache>/<recipe>-<hash>``: the hash covers the format version, recipe name and config."""
    root = config.cache_dir or default_cache_root()
    text = f"{FORMAT_VERSION}\0{recipe_name}\0{config.model_dump_json(exclude=set(NOT_STORED))}"
    return Path(root).expanduser() / f"{recipe_name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def make_cache_folder(folder: Path) -> None:
    """Creates the folder stores are built in, or says which key to change.

    Raises:
        DataError: it cannot be created or written (``/proc/...``, a read-only mount).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as exc:
        raise DataError(
            f"dataset.cache_dir: the store folder {folder} cannot be created or written "
            f"({exc.strerror or exc}); set dataset.cache_dir (or $RAYSIM_CACHE) to a folder you can write"
        ) from None


def prepare_store(recipe_name: str, config: BaseModel) -> Path:
    """Builds the store of ``recipe_name`` under ``config`` once and returns its directory.

    An existing complete store is reused without loading the recipe's data. A new one is built in
    a temporary directory and renamed into place, so a crash never leaves a half store behind and
    concurrent builders agree on one result.

    A recipe builds through one of two methods. Most define ``load_examples() -> Examples``
    (every row in memory), partitioned and written here. A recipe for corpora that do not fit
    in memory defines ``write_store(path, source)`` instead and writes the whole store itself
    (text recipes use ``raysim.data.text.writer``); its build directory has a fixed name,
    ``.<store name>.build``, and is kept when building fails, so that a re-run resumes it.

    Raises:
        ConfigError: unknown recipe or a config the recipe rejects.
        DataError: the data cannot be partitioned or written as asked.
    """
    entry = registry.get("dataset", recipe_name)
    config = _as_recipe_config(entry.config, config)
    path = store_path(recipe_name, config)
    if is_complete(path):
        return path
    make_cache_folder(path.parent)
    source = {"recipe": recipe_name, "config": config.model_dump(mode="json", exclude=set(NOT_STORED))}
    recipe = entry.factory(config)
    if hasattr(recipe, "write_store"):
        build = path.parent / f".{path.name}.build"
        recipe.write_store(build, source)
        _publish(build, path)
        shutil.rmtree(build, ignore_errors=True)  # left only when another process published first
        return path
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        examples = recipe.load_examples()
        part = partition_table(config.partition, examples.table, config.seed)
        write_store(
            examples,
            part,
            config.test_fraction,
            config.seed,
            tmp,
            source=source,
            stratify=config.stratify_test,
        )
        _publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _as_recipe_config(config_type: type[BaseModel], config: BaseModel) -> DatasetConfig:
    """Accepts a recipe's own config, or a base one completed with the recipe's defaults."""
    if not isinstance(config, config_type):
        try:
            config = config_type.model_validate(config.model_dump())
        except ValidationError as e:
            raise ConfigError(
                [f"dataset.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
            ) from None
    assert isinstance(config, DatasetConfig)  # registry.register refuses other dataset Configs
    return config


def _publish(tmp: Path, path: Path) -> None:
    try:
        os.rename(tmp, path)
    except OSError:
        if not is_complete(path):
            raise DataError(f"{path} exists but is not a complete store; delete it and retry") from None
        # Another process published the same store first; theirs is identical, keep it.


def open_dataset(recipe_name: str, config: BaseModel) -> ClientStore:
    """Prepares the store if needed and opens it: ``ClientStore.open(prepare_store(...))``.

    A store of at most ``FULL_CHECK_BYTES`` has every file hashed against its checksums too;
    opening any store checks its files' sizes (``raysim.data.integrity``).

    Raises:
        DataError: the store cannot be built, or its files no longer match their checksums.
    """
    store = ClientStore.open(prepare_store(recipe_name, config))
    if store_bytes(store.path, store.meta) <= FULL_CHECK_BYTES:
        verify_store(store.path)
    return store
