"""A text store's build in progress: its scratch folders, saved progress (state.json), lock and progress bars.

The streaming writer (``raysim.data.text.writer``) runs in a build directory that survives a
failure; what is here lets a re-run with the same config and source continue where the last stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raysim.data.format import FORMAT_VERSION
from raysim.data.text.recipes import TextDatasetConfig
from raysim.errors import DataError

STATE_FILE, LOCK_FILE, SPILL_DIR, BUCKET_DIR = "state.json", ".lock", "spill", "buckets"


@dataclass
class BuildState:
    """Progress of a build, saved as state.json in the build directory after every step."""

    fingerprint: str
    num_documents: int = 0  # consumed from the source at the last checkpoint (skipped included)
    num_skipped: int = 0
    num_parts: int = 0  # spill part files written before the last checkpoint
    is_spilled: bool = False
    has_tokenizer: bool = False
    num_buckets_done: int = 0
    num_dropped_clients: int = 0
    num_capped_sequences: int = 0

    def save(self, build: Path) -> None:
        tmp = build / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, build / STATE_FILE)  # atomic: a crash leaves the old or the new state


def remove_scratch(build: Path) -> None:
    """Deletes what only the build needed: spill, buckets, state and lock."""
    for name in (SPILL_DIR, BUCKET_DIR):
        shutil.rmtree(build / name, ignore_errors=True)
    for name in (STATE_FILE, LOCK_FILE):
        (build / name).unlink(missing_ok=True)


@contextlib.contextmanager
def locked(build: Path) -> Iterator[None]:
    """Holds an exclusive lock on the build directory: two builders would corrupt each other."""
    with open(build / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(f"another process is building the store in {build}") from None
        yield  # closing the file releases the lock


def load_state(build: Path, config: TextDatasetConfig, source: dict[str, Any] | None) -> BuildState:
    """The saved state of this build, or a fresh one (and a clean directory) for another config."""
    text = json.dumps(
        [FORMAT_VERSION, source, config.model_dump(mode="json", exclude={"cache_dir"})], sort_keys=True
    )
    fingerprint = hashlib.sha256(text.encode()).hexdigest()
    if (build / STATE_FILE).is_file():
        saved = json.loads((build / STATE_FILE).read_text())
        if saved.get("fingerprint") == fingerprint:
            return BuildState(**saved)
        for child in build.iterdir():  # another config's build: start over
            if child.name != LOCK_FILE:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    elif any(child.name != LOCK_FILE for child in build.iterdir()):
        raise DataError(f"{build} is not empty and holds no build state: build into an empty directory")
    state = BuildState(fingerprint)
    state.save(build)
    return state


def progress_bar(progress: bool, description: str, unit: str, **kwargs: Any) -> Any:
    """A tqdm bar on stderr (rate per second shown); silent when not on a terminal."""
    from tqdm.auto import tqdm

    return tqdm(
        desc=description,
        unit=unit,
        unit_scale=True,
        disable=None if progress else True,
        mininterval=1.0,
        **kwargs,
    )
