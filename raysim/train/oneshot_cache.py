"""The one-shot cache: the clients' locally trained models kept on disk, checked before any is used.

One entry is the folder ``<cache_dir>/<key>/``: one file per client (``client_<id>.pt``: its model
and weight) and ``manifest.json``, written last: the key's contents (the job fingerprint that made
the models: ``cache_key``) and, per client, its file's size and blake2b digest and its weight.

An entry is used whole or not at all. It is used when its manifest names this job's fingerprint and
every client file matches its size and digest, loads, holds the manifest's weight (finite, not
negative) and finite tensors of the job model's names and shapes. Anything else (a flipped byte, an
edited weight, a truncated, empty or foreign file, no manifest: an interrupted write or an older
raysim) is not an error: the run retrains every client of the entry and rewrites it, saying why in
one warning line. Training is a pure function of the seed, the round and the client, so the model
is the one the intact entry held. What retraining cannot fix without deleting something raysim did
not write (``cache_dir`` a file, a folder where a client's file goes) is refused in one line.

Usage:
    entry = CacheEntry.open(cache_dir, info, local, clients)   # CheckpointError: a path in the way
    found = entry.read(like=params, check_shapes=True)         # None: train, then entry.write(...)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim import params as P
from raysim.errors import CheckpointError
from raysim.train.local import LocalTrainConfig
from raysim.types import NumpyParams, Params, RunInfo

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OLD_KEY_FILE = "key.json"  # what entries written before the manifest held beside the client files


# the models and the weights (examples trained on), by client id
Cached = tuple[dict[int, NumpyParams], dict[int, float]]


def file_digest(path: Path) -> str:
    """The blake2b digest of one file, in hex (as a client store's checksums)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()


class Damaged(Exception):
    """Why an entry cannot be used (internal: it becomes one warning, then the entry is retrained)."""


def cache_root(cache_dir: str | None) -> Path:
    """The cache folder: ``cache_dir``, else ``$RAYSIM_HOME`` (or ``.raysim``) / oneshot_cache."""
    return (
        Path(cache_dir) if cache_dir else Path(os.environ.get("RAYSIM_HOME") or ".raysim") / "oneshot_cache"
    )


def cache_key(info: RunInfo, local: LocalTrainConfig, clients: np.ndarray) -> tuple[str, dict[str, Any]]:
    """The key of these clients' local models, and what it hashes (the job fingerprint)."""
    contents = {
        "dataset": info.dataset,
        "model": info.model,
        "seed": info.seed,
        "local": local.model_dump(mode="json"),
        "clients": [int(c) for c in clients],
    }
    if info.client_models:  # model_groups: each client's architecture (absent: keys as before)
        contents["client_models"] = [info.model_of(int(c)) for c in clients]
    # the manifest stores the fingerprint as JSON: compare what JSON gives back (tuples as lists)
    contents = json.loads(json.dumps(contents, sort_keys=True, default=str))
    text = json.dumps(contents, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20], contents


@dataclass(frozen=True)
class CacheEntry:
    """One key's folder of client models: where each file goes and the fingerprint it must record."""

    folder: Path
    files: dict[int, Path]  # client id -> its model file
    fingerprint: dict[str, Any]

    @classmethod
    def open(
        cls, cache_dir: str | None, info: RunInfo, local: LocalTrainConfig, clients: np.ndarray
    ) -> CacheEntry:
        """The entry of these clients' models, its folder made (before any client trains).

        Raises:
            CheckpointError: the folder cannot be made or written (``cache_dir`` is a file), or a
                folder or other non-file stands where a client's file goes.
        """
        key, fingerprint = cache_key(info, local, clients)
        folder = cache_root(cache_dir) / key
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            raise CheckpointError(
                f"algorithm.cache_dir: the one-shot cache folder {folder} cannot be created or written "
                f"({exc.strerror or exc}); set algorithm.cache_dir to a folder you can write"
            ) from None
        files = {int(c): folder / f"client_{int(c)}.pt" for c in clients}
        for path in [*files.values(), folder / MANIFEST]:
            if path.exists() and not path.is_file():  # retraining would have to delete it
                raise CheckpointError(
                    f"one-shot cache: {path} is not a file, yet the cache keeps a file there; remove "
                    f"it (rm -r {path}) or set algorithm.cache_dir to another folder"
                )
        return cls(folder, files, fingerprint)

    def read(self, like: Params, check_shapes: bool) -> Cached | None:
        """The cached models and weights by client id, or None when the entry must be (re)trained:
        absent, or damaged (then one warning line names the file and what is wrong).

        Args:
            like: the job's model: names and shapes every cached model must have.
            check_shapes: False when clients train different architectures (``like`` fits none).
        """
        if not (self.folder / MANIFEST).exists() and not any(f.exists() for f in self.files.values()):
            return None  # never written: a plain miss
        try:
            return self._verified(like, check_shapes)
        except Damaged as why:
            log.warning("one-shot cache %s: %s; retraining all %d clients", self.folder, why, len(self.files))
            return None

    def write(self, models: dict[int, NumpyParams], weights: dict[int, float]) -> None:
        """Saves every client's model, each atomically, then the manifest: a reader never uses an
        entry whose write did not finish."""
        try:
            (self.folder / MANIFEST).unlink(missing_ok=True)  # the old manifest would vouch for a mix
            recorded = {str(c): self._save(c, models[c], weights[c]) for c in self.files}
            manifest = {"format_version": FORMAT_VERSION, "key": self.fingerprint, "clients": recorded}
            partial = self.folder / f"{MANIFEST}.{os.getpid()}.tmp"
            partial.write_text(json.dumps(manifest, indent=2, sort_keys=True))
            partial.replace(self.folder / MANIFEST)
            (self.folder / OLD_KEY_FILE).unlink(missing_ok=True)  # the manifest holds the key now
        except OSError as exc:  # a full disk: without a manifest the entry is retrained next time
            raise CheckpointError(
                f"one-shot cache: could not write {self.folder} ({exc.strerror or exc}); free space "
                f"there or set algorithm.cache_dir to another folder"
            ) from None

    def _save(self, client: int, model: NumpyParams, weight: float) -> dict[str, Any]:
        """Writes one client's file atomically; what the manifest records of it."""
        path = self.files[client]
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two runs of one key may race
        torch.save({"params": P.from_numpy(model), "weight": weight}, partial)
        partial.replace(path)
        return {"bytes": path.stat().st_size, "blake2b": file_digest(path), "weight": weight}

    def _verified(self, like: Params, check_shapes: bool) -> Cached:
        recorded = self._manifest()
        models, weights = {}, {}
        for client, path in self.files.items():
            entry = recorded.get(str(client))
            if not isinstance(entry, dict):
                raise Damaged(f"{MANIFEST} records no file of client {client}")
            if not path.is_file():
                raise Damaged(f"{path.name} is missing")
            if path.stat().st_size != entry.get("bytes") or file_digest(path) != entry.get("blake2b"):
                raise Damaged(f"{path.name} does not match the size and checksum recorded with it")
            models[client], weights[client] = load_client_model(path, entry.get("weight"), like, check_shapes)
        return models, weights

    def _manifest(self) -> dict[str, Any]:
        """The manifest's per-client records, once it is found to be this job's."""
        try:
            manifest = json.loads((self.folder / MANIFEST).read_text())
        except FileNotFoundError:
            raise Damaged(f"no {MANIFEST} (an interrupted write, or an older raysim's entry)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Damaged(f"{MANIFEST} is unreadable ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
            raise Damaged(f"{MANIFEST} is not of format {FORMAT_VERSION}")
        if manifest.get("key") != self.fingerprint:
            raise Damaged(
                f"{MANIFEST} records another job's fingerprint (dataset, model, seed, local, clients)"
            )
        clients = manifest.get("clients")
        if not isinstance(clients, dict):
            raise Damaged(f"{MANIFEST} has no 'clients' record")
        return clients


def load_client_model(
    path: Path, recorded_weight: Any, like: Params, check_shapes: bool
) -> tuple[NumpyParams, float]:
    """One client's cached model and weight, checked against what the manifest and the job say."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        params, weight = saved["params"], float(saved["weight"])
    except Exception as exc:  # a checksum that matches garbage: any failure means "retrain"
        first_line = (str(exc).splitlines() or [""])[0]  # torch's own messages run to paragraphs
        raise Damaged(f"{path.name} is unreadable ({type(exc).__name__}: {first_line})") from None
    if not (math.isfinite(weight) and weight >= 0 and weight == recorded_weight):
        raise Damaged(f"{path.name} holds weight {weight:g}, not the {recorded_weight} recorded")
    if not isinstance(params, dict) or not all(isinstance(t, torch.Tensor) for t in params.values()):
        raise Damaged(f"{path.name} holds no dict of tensors")
    if check_shapes:
        shapes = {name: tuple(t.shape) for name, t in params.items()}
        expected = {name: tuple(t.shape) for name, t in like.items()}
        if shapes != expected:
            wrong = sorted(n for n in expected.keys() | shapes.keys() if shapes.get(n) != expected.get(n))
            raise Damaged(f"{path.name} does not fit the job's model ({', '.join(wrong[:3])})")
    if not P.is_finite(params):
        raise Damaged(f"{path.name} holds NaN or infinity")
    return P.to_numpy(params), weight
