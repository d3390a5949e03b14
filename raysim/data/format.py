"""The on-disk format of a client store, owned here: file names, ``meta.json``, the split rule.

A store is one directory, written once (``raysim.data.prepare`` for recipes that load their
examples, ``raysim.data.text.writer`` for streamed corpora) and read by ``ClientStore``:

    rows.arrow          Arrow IPC file, uncompressed so it can be memory-mapped: every client's
                        rows contiguous (client 0 first), its train rows then its test rows
    clients.parquet     client_id, key, offset, num_train, num_test[, label_hist (train rows)]
    central_test.arrow  optional central test set, same columns as rows.arrow
    meta.json           format version, spec, counts, mean/std, recipe + config, content hash;
                        written last, so its presence marks a complete store

Per-client split rule: a client with n rows keeps ``num_test = min(floor(n * test_fraction + 1/2),
n - 1)`` rows for test (round half up, but never its last train row) and ``n - num_test`` for
train, after a seeded shuffle of its rows (stream ``SPLIT_STREAM``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from raysim.errors import DataError

FORMAT_VERSION = 1
ROWS_FILE = "rows.arrow"
INDEX_FILE = "clients.parquet"
CENTRAL_FILE = "central_test.arrow"
META_FILE = "meta.json"
BATCH_ROWS = 65_536  # record batches of rows.arrow and row groups of clients.parquet
_REQUIRED_META = ("spec", "num_clients", "mean", "std", "has_central_test", "has_label_hist")
# A damaged store is rebuilt, not repaired: prepare skips a folder that holds a meta.json.
REBUILD = "delete the folder and prepare it again (raysim prepare JOB.yaml, or run the job)"
# The train/test shuffle draws from its own stream, independent of the partition's.
SPLIT_STREAM = 1


def split_sizes(sizes: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(num_train, num_test) per client by the rule in the module docstring."""
    num_test = np.floor(sizes * test_fraction + 0.5).astype(np.int64)
    num_test = np.minimum(num_test, np.maximum(sizes - 1, 0))
    return sizes - num_test, num_test


def content_hash(path: Path) -> str:
    """A digest of the data files (rows, index, central test set), recorded in ``meta.json``."""
    digest = hashlib.blake2b(digest_size=16)
    for name in (ROWS_FILE, INDEX_FILE, CENTRAL_FILE):
        if (path / name).is_file():
            with open(path / name, "rb") as f:
                digest.update(hashlib.file_digest(f, "blake2b").digest())
    return digest.hexdigest()


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """Writes ``meta.json`` with the format version and content hash; call it last."""
    meta = {"format_version": FORMAT_VERSION, **meta, "content_hash": content_hash(path)}
    (path / META_FILE).write_text(json.dumps(meta, indent=2))


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a finished store (``meta.json`` is written last)."""
    return (path / META_FILE).is_file()


def read_meta(path: Path) -> dict[str, Any]:
    """The store's ``meta.json``, checked for version and required keys."""
    if not path.is_dir():
        raise DataError(f"no client store at {path} (not a directory); prepare it first")
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not even text
        raise DataError(f"client store {path} has no readable {META_FILE} ({e}); {REBUILD}") from e
    if not isinstance(meta, dict):
        raise DataError(
            f"client store {path}: {META_FILE} holds a {type(meta).__name__}, not an object; {REBUILD}"
        )
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"client store {path} has format version {version!r}, this raysim reads "
            f"{FORMAT_VERSION}; {REBUILD}"
        )
    missing = [key for key in _REQUIRED_META if key not in meta]
    if missing:
        raise DataError(f"client store {path}: {META_FILE} lacks {', '.join(missing)}; {REBUILD}")
    return meta
