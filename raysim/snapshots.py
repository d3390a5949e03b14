"""Client-state snapshots: the files one must hold, listed as it is frozen and checked on resume.

A checkpoint's snapshot (``<stem>.client_state.r<round>/``: hard links into the live store, see
``raysim.runtime.client_state``) holds a ``snapshot_round`` marker and a ``manifest``, written last
and atomically: one line per client-state file with its size and a fingerprint, the CRC-32 of the
archive's list of entries (each entry's name, CRC-32 and size, as the zip's central directory holds
them). Listing costs one small read per file whatever its size, where hashing would read every
byte at every checkpoint; on resume the entries' own CRCs (``testzip``) then vouch for the rest.
The checkpoint records the manifest's digest (``manifest_digest``), so a missing, torn or edited
manifest is refused too. A checkpoint that records none was written before manifests existed: its
snapshot is taken as before (the CRCs of the files present), with a warning.

The manifest, one file a line in the order frozen (bytes, fingerprint, path inside the snapshot)::

    raysim client-state snapshot manifest 1
    1592 5be0c1d2 0007/7/3.pt
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from raysim.errors import CheckpointError

SNAPSHOT_ROUND_FILE = "snapshot_round"  # the round it froze
MANIFEST_FILE = "manifest"  # the files it froze
_HEADER = "raysim client-state snapshot manifest 1\n"
_EARLIER = "resume from an earlier checkpoint of the run (round_NNNNN.pt beside it)"
_RECOPY = f"a partial copy? copy the folder again whole, or {_EARLIER}"

log = logging.getLogger("raysim")


def write_manifest(folder: Path, files: Iterable[Path]) -> int:
    """Lists ``files`` (inside ``folder``, consumed as they are frozen) in ``folder``'s manifest,
    put in place once the last is listed; returns how many it lists."""
    tmp = folder / f".{MANIFEST_FILE}.tmp{os.getpid()}"  # hidden: never taken for client state
    num_files = 0
    with tmp.open("w") as out:
        out.write(_HEADER)
        for file in files:
            with zipfile.ZipFile(file) as archive:
                out.write(
                    f"{file.stat().st_size} {_fingerprint(archive)} {file.relative_to(folder).as_posix()}\n"
                )
            num_files += 1
    tmp.replace(folder / MANIFEST_FILE)
    return num_files


def manifest_digest(folder: Path) -> str | None:
    """The digest of ``folder``'s manifest, for its checkpoint to record; None when it has none."""
    manifest = folder / MANIFEST_FILE
    return _digest(manifest) if manifest.is_file() else None


def check_snapshot(checkpoint: Path, folder: Path, round_num: int, digest: str | None) -> None:
    """Checks the snapshot ``checkpoint`` names: it froze ``round_num``, holds exactly the files its
    manifest lists (``digest``: the manifest's, as the checkpoint recorded it), each unchanged.

    Raises:
        CheckpointError: another round's snapshot; a manifest missing or not the one recorded; a
            listed file missing, of another size or content; a ``.pt`` file it does not list.
    """
    _check_round(checkpoint, folder, round_num)
    remedy = f"it is part of the client-state snapshot of {checkpoint}: {_EARLIER}"
    if digest is None:
        log.warning(
            "%s's client-state snapshot %s has no manifest (written before raysim listed a snapshot's "
            "files): resuming as before, from the files it holds; a file missing from it cannot be told",
            checkpoint,
            folder,
        )
        for file in sorted(_state_files(folder)):
            checked_fingerprint(file, remedy)
        return
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        raise CheckpointError(
            f"client-state snapshot {folder}: its manifest {manifest}, which {checkpoint.name} was written "
            f"with, is missing; {_RECOPY}"
        )
    if _digest(manifest) != digest:
        raise CheckpointError(
            f"{manifest} does not match the digest {checkpoint} recorded for it (torn, edited, or another "
            f"snapshot's); {_EARLIER}"
        )
    listed = _check_listed_files(folder, manifest, remedy)
    if listed != sum(1 for _ in _state_files(folder)):  # the names are compared only when counts differ
        names = {name for name, _, _ in _listing(manifest)}
        strays = sorted(file.relative_to(folder) for file in _state_files(folder))
        stray = next((name for name in strays if name.as_posix() not in names), None)
        assert stray is not None, f"{manifest} lists a file twice"  # raysim lists each file once
        raise CheckpointError(
            f"client-state snapshot {folder}: {stray} is not in its manifest (the snapshot froze no such "
            f"file, and a resume would restore it as a client's state): delete it if it was copied in by "
            f"mistake, or {_EARLIER}"
        )


def _check_listed_files(folder: Path, manifest: Path, remedy: str) -> int:
    """Each listed file is there, of its size and fingerprint, its entries matching their CRCs;
    returns how many are listed. Streams the manifest: a million clients need no list in memory."""
    num_listed = 0
    for name, size, fingerprint in _listing(manifest):
        file = folder / name
        try:
            held = file.stat().st_size
        except FileNotFoundError:
            others = sum(1 for other, _, _ in _listing(manifest) if not (folder / other).exists()) - 1
            more = f" (and {others} more files it lists)" if others else ""
            raise CheckpointError(
                f"client-state snapshot {folder}: {name} is missing{more}; {_RECOPY}"
            ) from None
        if held != size:
            raise CheckpointError(
                f"client-state snapshot {folder}: {name} has {held} bytes where its manifest recorded {size} "
                f"(truncated or changed since it was frozen); {_EARLIER}"
            )
        if checked_fingerprint(file, remedy) != fingerprint:
            raise CheckpointError(
                f"client-state snapshot {folder}: {name} is not the file it froze (its entries' CRC-32s "
                f"differ from those its manifest recorded: replaced since); {_EARLIER}"
            )
        num_listed += 1
    return num_listed


def _listing(manifest: Path) -> Iterator[tuple[str, int, str]]:
    """(path inside the snapshot, bytes, fingerprint) of each file a manifest lists."""
    with manifest.open() as lines:
        if lines.readline() != _HEADER:
            raise CheckpointError(
                f"{manifest} is not a manifest of this raysim (expected {_HEADER.strip()!r})"
            )
        for number, line in enumerate(lines, start=2):
            size, fingerprint, name = (line.rstrip("\n").split(" ", 2) + ["", ""])[:3]
            path = PurePosixPath(name)
            if not size.isdigit() or len(fingerprint) != 8 or path.is_absolute() or ".." in path.parts:
                raise CheckpointError(f"{manifest}: line {number} is not one raysim writes: {line[:80]!r}")
            yield name, int(size), fingerprint


def checked_fingerprint(file: Path, remedy: str) -> str:
    """The fingerprint of a torch file (a checkpoint, a client-state file), once each of its
    entries matched the CRC-32 recorded when it was written (``checkpoint.check_archive``)."""
    try:
        with zipfile.ZipFile(file) as archive:
            damaged, fingerprint = archive.testzip(), _fingerprint(archive)
    except Exception as exc:  # BadZipFile, a damaged local header, a failed read
        raise CheckpointError(f"{file} is a damaged torch file ({exc}); {remedy}") from exc
    if damaged is not None:
        raise CheckpointError(
            f"{file} is corrupt: its entry {damaged} does not match the checksum (CRC-32) recorded when "
            f"it was written (damaged since); {remedy}"
        )
    return fingerprint


def _fingerprint(archive: zipfile.ZipFile) -> str:
    """The CRC-32 of an archive's entry list (names, CRC-32s and sizes): read from its central
    directory, so the cost does not grow with the file."""
    entries = "".join(f"{entry.filename} {entry.CRC:08x} {entry.file_size}\n" for entry in archive.infolist())
    return f"{zlib.crc32(entries.encode()):08x}"


def _digest(file: Path) -> str:
    with file.open("rb") as content:
        return hashlib.file_digest(content, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def _state_files(folder: Path) -> Iterator[Path]:
    """Every file a resume could restore as client state: the ``.pt`` files; hidden ones (macOS's
    ``._3.pt``) are never read."""
    return (file for file in folder.rglob("*.pt") if not file.name.startswith("."))


def _check_round(checkpoint: Path, folder: Path, round_num: int) -> None:
    """The snapshot must have frozen the checkpoint's own round; snapshots written before the
    marker existed have none and are taken as they are."""
    marker = folder / SNAPSHOT_ROUND_FILE
    if not marker.is_file():
        return
    text = marker.read_text().strip()
    if text != str(round_num):
        raise CheckpointError(
            f"{checkpoint} holds round {round_num} but its client-state snapshot {folder} froze round "
            f"{text!r} ({marker}): the two come from different writes (one interrupted?), and "
            f"resuming them would give a wrong model; resume from another checkpoint of the run "
            f"(round_NNNNN.pt beside it) or start the run again"
        )
