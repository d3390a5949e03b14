"""The on-disk format of a client store, owned here: file names, ``meta.json``, the split rule.

A store is one directory, written once (``raysim.data.prepare`` for recipes that load their
examples, ``raysim.data.text.writer`` for streamed corpora) and read by ``ClientStore``:

    rows.arrow          Arrow IPC file, uncompressed so it can be memory-mapped: every client's
                        rows contiguous (client 0 first), its train rows then its test rows
    clients.parquet     client_id, key, offset, num_train, num_test[, label_hist (train rows)]
    counts.npy          (3, num_clients) int64: offset, num_train, num_test again, as a numpy file
                        the reader memory-maps (stores prepared before it read clients.parquet)
    central_test.arrow  optional central test set, same columns as rows.arrow
    meta.json           format version, spec, counts, mean/std, recipe + config, content hash,
                        each file's size and checksum ("files", ``raysim.data.integrity``);
                        written last, so its presence marks a complete store

Per-client split rule: a client with n rows keeps ``num_test = min(floor(n * test_fraction + 1/2),
n - 1)`` rows for test (round half up, but never its last train row) and ``n - num_test`` for
train, after a seeded shuffle of its rows (stream ``SPLIT_STREAM``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from raysim.errors import DataError

FORMAT_VERSION = 1
ROWS_FILE = "rows.arrow"
INDEX_FILE = "clients.parquet"
CENTRAL_FILE = "central_test.arrow"
COUNTS_FILE = "counts.npy"  # checksummed with the others, but outside content_hash (derived)
META_FILE = "meta.json"
DATA_FILES = (ROWS_FILE, INDEX_FILE, CENTRAL_FILE)  # what content_hash covers, in this order
FILES_KEY = "files"  # meta.json's {relative path: {"bytes": size, "blake2b": hex digest}}
META_DIGEST_KEY = "meta_blake2b"  # meta.json's digest of its own other keys (``meta_digest``)
BATCH_ROWS = 65_536  # record batches of rows.arrow and row groups of clients.parquet
_REQUIRED_META = ("spec", "num_clients", "mean", "std", "has_central_test", "has_label_hist")
# A damaged store is rebuilt, not repaired: prepare skips a folder that holds a meta.json.
REBUILD = "delete the folder and prepare it again"
# The train/test shuffle draws from its own stream, independent of the partition's.
SPLIT_STREAM = 1


def split_sizes(sizes: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(num_train, num_test) per client by the rule in the module docstring."""
    num_test = np.floor(sizes * test_fraction + 0.5).astype(np.int64)
    num_test = np.minimum(num_test, np.maximum(sizes - 1, 0))
    return sizes - num_test, num_test


def file_digest(path: Path) -> str:
    """The blake2b digest of one file, in hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()


def file_manifest(path: Path, extra: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Size and digest of each data file of the store in ``path`` and of ``extra`` files or
    folders (a text store's tokenizer), by path relative to the store, sorted."""
    files = [path / name for name in DATA_FILES if (path / name).is_file()]
    for name in extra:
        files += (
            sorted(p for p in (path / name).rglob("*") if p.is_file())
            if (path / name).is_dir()
            else [path / name]
        )
    return {
        f.relative_to(path).as_posix(): {"bytes": f.stat().st_size, "blake2b": file_digest(f)}
        for f in sorted(files)
    }


def content_hash(files: dict[str, dict[str, Any]]) -> str:
    """One digest of the data files (rows, index, central test set), from their ``file_manifest``
    entries; defined so that stores written before per-file checksums keep theirs."""
    digest = hashlib.blake2b(digest_size=16)
    for name in DATA_FILES:
        if name in files:
            digest.update(bytes.fromhex(files[name]["blake2b"]))
    return digest.hexdigest()


def write_meta(path: Path, meta: dict[str, Any], extra_files: Iterable[str] = ()) -> None:
    """Writes ``meta.json`` with the format version, the checksum of every data file (and of
    ``extra_files``, paths relative to ``path``) and the content hash; call it last."""
    files = file_manifest(path, extra_files)
    meta = {"format_version": FORMAT_VERSION, **meta, "content_hash": content_hash(files), FILES_KEY: files}
    replace_meta(path, meta)


def meta_digest(meta: dict[str, Any]) -> str:
    """The blake2b digest of meta.json's content bar ``META_DIGEST_KEY``, as canonical JSON (sorted
    keys, no spaces), so that the file's layout may change but none of its values."""
    content = {key: value for key, value in meta.items() if key != META_DIGEST_KEY}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def replace_meta(path: Path, meta: dict[str, Any]) -> None:
    """Writes ``meta.json`` atomically (a reader sees the old file or the new one, never half),
    with the digest of its own content under ``META_DIGEST_KEY``."""
    meta = json.loads(json.dumps(meta))  # digest what a reader will see: tuples as lists, keys as text
    tmp = path / f"{META_FILE}.tmp"
    tmp.write_text(json.dumps({**meta, META_DIGEST_KEY: meta_digest(meta)}, indent=2))
    os.replace(tmp, path / META_FILE)


def rebuild_hint(path: Path, meta: dict[str, Any] | None = None) -> str:
    """How to rebuild a damaged store: the exact commands when ``meta`` names its recipe."""
    remove = f"rm -r {shlex.quote(str(path))}"
    recipe = (meta or {}).get("recipe")
    if not isinstance(recipe, str) or not isinstance((meta or {}).get("config"), dict):
        return f"{REBUILD}: {remove}, then raysim prepare JOB.yaml (or run the job)"
    options = _changed_options(recipe, (meta or {})["config"])
    if path.parent.resolve() != default_cache_root().resolve():
        options.append(f"cache_dir={path.parent}")
    command = " ".join(["raysim prepare", recipe, *map(shlex.quote, options)])
    return f"{REBUILD}: {remove} && {command}"


def default_cache_root() -> Path:
    """Where stores go when the dataset section sets no ``cache_dir``."""
    return Path(os.environ.get("RAYSIM_CACHE") or Path.home() / ".cache" / "raysim").expanduser()


def _changed_options(recipe: str, config: dict[str, Any]) -> list[str]:
    """``key=value`` options that give ``config`` back from the recipe's defaults."""
    from raysim import registry

    try:
        fields = registry.get("dataset", recipe).config.model_fields
        defaults = {
            name: _json(field.get_default(call_default_factory=True))
            for name, field in fields.items()
            if not field.is_required()
        }
    except Exception:  # a hint never fails: without the recipe's defaults, give every option
        defaults = {}
    return [f"{key}={_yaml_value(value)}" for key, value in _leaves(_changes(config, defaults))]


def _changes(config: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """What differs from ``defaults``; a section of another ``kind`` (a dirichlet partition over
    the default iid one) whole, since options then start from that kind's own defaults."""
    out = {}
    for key, value in config.items():
        default = defaults.get(key, KeyError)
        if value == default:
            continue
        same_kind = (
            isinstance(value, dict) and isinstance(default, dict) and value.get("kind") == default.get("kind")
        )
        out[key] = _changes(value, default) if same_kind else value
    return out


def _json(value: Any) -> Any:
    """A default as meta.json holds it (a pydantic model as its JSON dump)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if dump is not None else json.loads(json.dumps(value))


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _yaml_value(value: Any) -> str:
    """``value`` as an override reads it back (overrides are parsed as YAML)."""
    import yaml

    if isinstance(value, str):
        try:
            if yaml.safe_load(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


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
        raise DataError(f"client store {path} has no readable {META_FILE} ({e}); {rebuild_hint(path)}") from e
    if not isinstance(meta, dict):
        raise DataError(
            f"client store {path}: {META_FILE} holds a {type(meta).__name__}, not an object; "
            f"{rebuild_hint(path)}"
        )
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"client store {path} has format version {version!r}, this raysim reads "
            f"{FORMAT_VERSION}; {rebuild_hint(path, meta)}"
        )
    missing = [key for key in _REQUIRED_META if key not in meta]
    if missing:
        raise DataError(
            f"client store {path}: {META_FILE} lacks {', '.join(missing)}; {rebuild_hint(path, meta)}"
        )
    recorded = meta.get(META_DIGEST_KEY)  # absent in stores prepared before it: --rehash adds it
    if recorded is not None and recorded != meta_digest(meta):
        raise DataError(
            f"client store {path}: {META_FILE} does not match the checksum of its content recorded "
            f"when the store was prepared (edited or corrupted since); {rebuild_hint(path, meta)}"
        )
    return meta
