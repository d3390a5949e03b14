"""Per-client persistent state (SCAFFOLD's c_i, FedDyn's h_i, FuseFL's private blocks) on disk.

State lives outside the workers, so it survives worker restarts and scales to many clients. Every
write is a new immutable file named by its round, ``<shard>/<client_id>/<round>.pt``, and a read
takes the newest file of an earlier round. So a retried round never sees what a failed attempt
wrote, and a checkpoint can freeze the directory cheaply with hard links (``snapshot``), listing
the files it froze in a manifest that a resume checks (``raysim.snapshots``): no file is changed
in place, so a frozen file stays what its manifest says while the live store goes on.
Each client keeps two versions: the newest before the round being written, and that round's.
A client's files have a folder of their own (in one of 1024 shards, by id), so a read lists two
or three names whatever the population: ten million clients in one folder per shard made every
read scan ten thousand. The ``LAYOUT_FILE`` marks this layout; folders of the older one
(``<shard>/<client_id>.<round>.pt``) are converted by ``migrate`` (``restore`` converts a
checkpoint's snapshot as it copies it). Files hold CPU tensors, whatever device the client
trained on, so a run's state reads back on a host without that device (``raysim analyze``, a
resume elsewhere); ``get`` maps them to the device its caller asks for.

Usage:
    store = ClientStateStore(tmp_dir)
    store.put(client_id=7, round_num=3, state={"c": tensor})
    store.get(client_id=7, before_round=4)        # -> {"c": tensor}
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from raysim.errors import DataError
from raysim.params import check_loadable, to_cpu
from raysim.snapshots import SNAPSHOT_ROUND_FILE, write_manifest
from raysim.stored import plain

NUM_SHARDS = 1024
LAYOUT_FILE = "layout"  # holds LAYOUT: a folder per client
LAYOUT = "client-folders\n"
MIGRATE_COMMAND = "python -m raysim.runtime.client_state"


class ClientStateStore:
    """A directory of per-client, per-round state files (torch.save of plain values).

    Raises:
        DataError: ``root`` holds state in the older flat layout (the message names ``migrate``).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / LAYOUT_FILE).is_file():
            if any(_flat_files(self.root)):
                raise DataError(
                    f"client state in {self.root} has the flat layout of an older raysim; convert it "
                    f"once with: {MIGRATE_COMMAND} {self.root}"
                )
            _mark_layout(self.root)

    def _folder(self, client_id: int) -> Path:
        return self.root / _client_folder(client_id)

    def _versions(self, client_id: int) -> dict[int, Path]:
        """Round -> file of every version this client has: its own folder's two or three names."""
        folder = self._folder(client_id)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return {}
        return {int(name[:-3]): folder / name for name in names if _is_round_file(name)}

    def get(self, client_id: int, before_round: int, device: torch.device | str = "cpu") -> Any | None:
        """The state this client wrote in its newest round before ``before_round``, or None; its
        tensors on ``device``."""
        versions = self._versions(client_id)
        earlier = [r for r in versions if r < before_round]
        if not earlier:
            return None
        path = versions[max(earlier)]
        try:
            return torch.load(path, map_location=device, weights_only=True)
        except Exception as exc:  # a truncated file: say which client, keep the cause
            raise DataError(f"client state file {path} is unreadable: {exc}") from exc

    def put(self, client_id: int, round_num: int, state: Any) -> None:
        """Saves the state written in ``round_num`` (atomically) and drops older versions.

        A dataclass state is saved as the dict of its fields; ``get`` returns that dict, which
        the worker rebuilds as the plugin's ``ClientState``.

        Raises:
            TypeError: the state holds something a weights-only load cannot read back.
        """
        state = plain(state)  # the plugin's dataclass as the dict of its fields (``from_plain``)
        check_loadable(state, f"client {client_id}'s state")
        state = to_cpu(state)  # device tensors would load only where that device exists
        folder = self._folder(client_id)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{round_num}.pt"
        tmp = folder / f".{round_num}.tmp{os.getpid()}"
        torch.save(state, tmp)
        tmp.replace(path)  # a new inode: snapshots holding the old file keep it
        versions = self._versions(client_id)
        earlier = [r for r in versions if r < round_num]
        keep = {round_num, max(earlier)} if earlier else {round_num}
        for r, old in versions.items():
            if r not in keep and r < round_num:
                old.unlink(missing_ok=True)

    def snapshot(self, target: str | Path, up_to_round: int, up_to_key: int | None = None) -> Path | None:
        """Freezes the versions written up to ``up_to_round`` into ``target`` (hard links), with its
        round and, last, the manifest of its files; replaces a snapshot already there (a continued
        run writing its ``final.pt`` again). ``up_to_key``: the newest file to freeze where files
        are not named by round (an asynchronous run's, by launch: ``RoundOptions.state_keys``).

        Returns ``target``, or None when no client had state (nothing to freeze, no folder).
        """
        target = Path(target)
        fresh, stale = target.with_name(target.name + ".new"), target.with_name(target.name + ".old")
        shutil.rmtree(fresh, ignore_errors=True)
        try:
            _mark_layout(fresh)  # marker and layout first, the manifest last: a snapshot in place is whole
            (fresh / SNAPSHOT_ROUND_FILE).write_text(f"{up_to_round}\n")
            last = up_to_round if up_to_key is None else up_to_key
            num_frozen = write_manifest(fresh, self._link_into(fresh, last))
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)  # a partial snapshot (a full disk, say) is never kept
            raise
        if target.exists():  # swapped, not overwritten: links to the same files cannot be copied over
            shutil.rmtree(stale, ignore_errors=True)
            target.rename(stale)
        if num_frozen:
            fresh.rename(target)
        else:
            shutil.rmtree(fresh, ignore_errors=True)  # nothing to freeze: no folder
        shutil.rmtree(stale, ignore_errors=True)
        return target if num_frozen else None

    def _link_into(self, folder: Path, last: int) -> Iterator[Path]:
        """Hard-links each version written up to ``last`` into ``folder``; yields each link."""
        for path in _round_files(self.root):
            if int(path.name[:-3]) <= last:
                dest = folder / path.relative_to(self.root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(path, dest)
                yield dest

    def restore(self, snapshot: str | Path) -> None:
        """Fills this (empty) store from a snapshot, by hard links; a snapshot in the older flat
        layout lands in this one."""
        snapshot = Path(snapshot)
        for path in _round_files(snapshot):
            dest = self.root / path.relative_to(snapshot)
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(path, dest)
        for path, client_id, round_num in _flat_files(snapshot):
            dest = self._folder(client_id) / f"{round_num}.pt"
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(path, dest)

    def num_clients(self) -> int:
        """How many clients have any state (walks the directory: for tests and reports)."""
        return len({path.parent for path in _round_files(self.root)})


def migrate(root: str | Path) -> int:
    """Converts a client-state folder (or a checkpoint's snapshot) of the flat layout in place;
    returns how many files moved. Renames only, so hard-linked snapshots keep sharing files."""
    root = Path(root)
    moved = 0
    for path, client_id, round_num in list(_flat_files(root)):
        dest = root / _client_folder(client_id) / f"{round_num}.pt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        path.replace(dest)
        moved += 1
    _mark_layout(root)
    return moved


def _client_folder(client_id: int) -> str:
    return f"{client_id % NUM_SHARDS:04d}/{client_id}"


def _is_round_file(name: str) -> bool:
    return name.endswith(".pt") and name[:-3].isdigit()


def _round_files(root: Path) -> Iterator[Path]:
    """Every ``<shard>/<client_id>/<round>.pt`` under ``root``."""
    return (p for p in root.glob("*/*/*.pt") if _is_round_file(p.name))


def _flat_files(root: Path) -> Iterator[tuple[Path, int, int]]:
    """(file, client id, round) of each ``<shard>/<client_id>.<round>.pt``: the older layout."""
    for path in root.glob("*/*.pt"):
        client, _, round_num = path.name[:-3].partition(".")
        if client.isdigit() and round_num.isdigit():
            yield path, int(client), int(round_num)


def _mark_layout(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{LAYOUT_FILE}.tmp{os.getpid()}"
    tmp.write_text(LAYOUT)
    tmp.replace(root / LAYOUT_FILE)  # workers opening one folder at once all write the same


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, dest)


if __name__ == "__main__":  # python -m raysim.runtime.client_state FOLDER...: the flat layout converted
    for folder in sys.argv[1:]:
        print(f"{folder}: {migrate(folder)} files moved to per-client folders")
