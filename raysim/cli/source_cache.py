"""Values computed from raysim's and its plugins' source, kept on disk until that source changes.

``raysim ls`` describes plugins by their pydantic Configs, and reading a Config means importing
its plugin file, which imports torch (seconds). What it shows depends only on the source, so it
is computed once and kept, as JSON under the cache root (``RAYSIM_CACHE``), with a fingerprint of
every ``.py`` file of the package and of the plugin folders (``RAYSIM_PLUGIN_PATH`` included):
its path, size and modification time, as Python's own bytecode cache checks a source file. Any
edit, new file or other plugin path computes it afresh.

Usage:
    entries = cached("ls", lambda: {"algorithms": [...]})   # any JSON value
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent
PLUGIN_FOLDERS = ("algorithms", "datasets")


def source_fingerprint() -> str:
    """A hash of the package's and the plugin folders' ``.py`` files (path, size, modification
    time) and of the Python and pydantic versions (which shape how a Config reads)."""
    import pydantic

    from raysim.registry import plugin_roots

    files = sorted(PACKAGE.rglob("*.py"))
    for root in plugin_roots():
        files += sorted(path for folder in PLUGIN_FOLDERS for path in (root / folder).glob("*.py"))
    digest = hashlib.sha256(f"{sys.version}\0{pydantic.VERSION}".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def cache_root() -> Path:
    """The stores' cache root, as ``raysim.data.format.default_cache_root`` (whose module imports
    numpy, which a cached ``raysim ls`` does not need; a test holds the two equal)."""
    return Path(os.environ.get("RAYSIM_CACHE") or Path.home() / ".cache" / "raysim").expanduser()


def cached(name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s JSON value, read from the cache while the source is unchanged.

    A cache that cannot be read is computed afresh; one that cannot be written is skipped.
    """
    path = cache_root() / f"{name}.json"
    fingerprint = source_fingerprint()
    with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: computed afresh
        saved = json.loads(path.read_text())
        if isinstance(saved, dict) and saved.get("fingerprint") == fingerprint:
            return saved["value"]
    value = compute()
    with contextlib.suppress(OSError):  # a read-only cache root costs time, not correctness
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as out:
            json.dump({"fingerprint": fingerprint, "value": value}, out)
        os.replace(out.name, path)  # whole or not at all: another `raysim ls` may be reading
    return value
