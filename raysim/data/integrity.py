"""Checking a client store's files against the checksums recorded when it was prepared.

``write_meta`` (``raysim.data.format``) records each file's size and blake2b digest in
``meta.json`` under "files": the rows, the client index, the central test set and a text store's
tokenizer. They are checked at three levels of cost:

- ``check_sizes``, a stat per file, on every ``ClientStore.open``: catches a truncated or
  partially copied file before Arrow or parquet trip over it;
- ``verify_store`` hashes every file (blake2b: 64 MiB in about 0.2 s): ``open_dataset`` runs it
  on every store of at most ``FULL_CHECK_BYTES``, ``raysim prepare --verify`` on every store;
- ``rehash_store`` records per-file checksums in a store prepared before they existed, once its
  files match the content hash that every store records.

meta.json itself carries the digest of its own content (``META_DIGEST_KEY``), checked by
``read_meta`` on every open: an edited ``mean`` or ``spec`` fails there, not in training. A store
prepared before it opens unchecked until ``rehash_store`` records it.

A mismatch is a ``DataError`` naming the store, the file and the commands that rebuild it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.data.format import (
    COUNTS_FILE,
    DATA_FILES,
    FILES_KEY,
    META_DIGEST_KEY,
    META_FILE,
    content_hash,
    file_digest,
    file_manifest,
    read_meta,
    rebuild_hint,
    replace_meta,
)
from raysim.errors import DataError

FULL_CHECK_BYTES = 64 << 20  # stores up to 64 MiB are hashed whenever a run opens them (~0.2 s)


@dataclass(frozen=True)
class StoreCheck:
    """What ``verify_store`` checked.

    Attributes:
        num_files: files hashed.
        num_bytes: their total size.
        has_checksums: False for a store prepared before per-file checksums: its data files were
            checked together against its content hash, and its tokenizer (if any) not at all.
    """

    num_files: int
    num_bytes: int
    has_checksums: bool


def recorded_files(path: Path, meta: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """meta.json's per-file checksums, or None for a store prepared before they existed.

    Raises:
        DataError: the entry is malformed.
    """
    files = meta.get(FILES_KEY)
    if files is None:
        return None
    if not isinstance(files, dict) or not all(
        isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("blake2b"), str)
        for entry in files.values()
    ):
        raise DataError(
            f"client store {path}: {META_FILE} has a malformed {FILES_KEY!r} entry; "
            f"{rebuild_hint(path, meta)}"
        )
    return files


def check_sizes(path: Path, meta: dict[str, Any]) -> None:
    """Each recorded file exists with its recorded size (no-op for an older store).

    Raises:
        DataError: a file is missing or has another size, naming it and the fix.
    """
    files = recorded_files(path, meta) or {}
    problems = []
    for name, entry in files.items():
        if not (path / name).is_file():
            problems.append(f"{name} is missing")
        elif (size := (path / name).stat().st_size) != entry["bytes"]:
            problems.append(
                f"{name} is {size:,} bytes, not the {entry['bytes']:,} it was written with "
                f"(truncated or overwritten)"
            )
    if problems:
        raise DataError(f"client store {path}: {'; '.join(problems)}; {rebuild_hint(path, meta)}")


def store_bytes(path: Path, meta: dict[str, Any]) -> int:
    """The size of the files a full check hashes."""
    files = recorded_files(path, meta)
    if files is not None:
        return sum(entry["bytes"] for entry in files.values())
    return sum((path / name).stat().st_size for name in DATA_FILES if (path / name).is_file())


def verify_store(path: str | Path) -> StoreCheck:
    """Hashes every file of the store and compares it with what meta.json recorded.

    Raises:
        DataError: meta.json is unreadable, or a file is missing, of another size or corrupt;
            the message names the store, each such file and the commands that rebuild it.
    """
    path = Path(path)
    meta = read_meta(path)
    files = recorded_files(path, meta)
    if files is None:
        found = _check_content_hash(path, meta)
        return StoreCheck(len(found), sum(e["bytes"] for e in found.values()), has_checksums=False)
    check_sizes(path, meta)
    corrupt = [name for name, entry in files.items() if file_digest(path / name) != entry["blake2b"]]
    if corrupt:
        raise DataError(
            f"client store {path}: {', '.join(corrupt)} {'does' if len(corrupt) == 1 else 'do'} not match "
            f"the checksum recorded when the store was prepared (corrupted since); {rebuild_hint(path, meta)}"
        )
    return StoreCheck(len(files), sum(e["bytes"] for e in files.values()), has_checksums=True)


def rehash_store(path: str | Path) -> StoreCheck:
    """Records per-file checksums in a store prepared before they existed, once its data files
    match its content hash; a store that has them is only verified. Either way meta.json's digest
    of its own content is recorded where it is missing.

    Raises:
        DataError: as ``verify_store``: a store that no longer matches is rebuilt, not rehashed.
    """
    path = Path(path)
    meta = read_meta(path)
    if recorded_files(path, meta) is not None:
        check = verify_store(path)
        if META_DIGEST_KEY not in meta:
            replace_meta(path, meta)  # records it
        return check
    tokenizer = meta.get("tokenizer")
    extra = [tokenizer["file"]] if isinstance(tokenizer, dict) and tokenizer.get("file") else []
    extra += [COUNTS_FILE] if (path / COUNTS_FILE).is_file() else []  # derived from the index
    files = _check_content_hash(path, meta, extra)
    replace_meta(path, {**meta, FILES_KEY: files})
    return StoreCheck(len(files), sum(e["bytes"] for e in files.values()), has_checksums=True)


def _check_content_hash(
    path: Path, meta: dict[str, Any], extra: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The store's files hashed now, after checking its data files against its content hash."""
    files = file_manifest(path, extra or [])
    if content_hash(files) != meta.get("content_hash"):
        names = ", ".join(name for name in DATA_FILES if name in files)
        raise DataError(
            f"client store {path}: its data files ({names}) do not match the content hash recorded "
            f"when it was prepared (it predates per-file checksums, so which file is unknown); "
            f"{rebuild_hint(path, meta)}"
        )
    return files
