"""Per-client persistent state (SCAFFOLD's c_i, FedDyn's h_i, FuseFL's private blocks) on disk.

State lives outside the workers, so it survives worker restarts and scales to many clients. Every
write is a new immutable file named by its round, ``<shard>/<client_id>.<round>.pt``, and a read
takes the newest file of an earlier round. So a retried round never sees what a failed attempt
wrote, and a checkpoint can freeze the directory cheaply with hard links (``snapshot``).
Each client keeps two versions: the newest before the round being written, and that round's.
Files hold CPU tensors, whatever device the client trained on, so a run's state reads back on a
host without that device (``raysim analyze``, a resume elsewhere); ``get`` maps them to the
device its caller asks for.

Usage:
    store = ClientStateStore(tmp_dir)
    store.put(client_id=7, round_num=3, state={"c": tensor})
    store.get(client_id=7, before_round=4)        # -> {"c": tensor}
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from raysim.checkpoint import SNAPSHOT_ROUND_FILE
from raysim.errors import DataError
from raysim.params import check_loadable, to_cpu
from raysim.stored import plain


class ClientStateStore:
    """A directory of per-client, per-round state files (torch.save of plain values)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _folder(self, client_id: int) -> Path:
        return self.root / f"{client_id % 1024:04d}"

    def _versions(self, client_id: int) -> dict[int, Path]:
        """Round -> file of every version this client has."""
        folder = self._folder(client_id)
        if not folder.is_dir():
            return {}
        prefix = f"{client_id}."
        return {
            int(p.name.split(".")[1]): p
            for p in folder.glob(f"{client_id}.*.pt")
            if p.name.startswith(prefix) and p.name.split(".")[1].isdigit()
        }

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
        folder.mkdir(exist_ok=True)
        path = folder / f"{client_id}.{round_num}.pt"
        tmp = folder / f".{client_id}.{round_num}.tmp{os.getpid()}"
        torch.save(state, tmp)
        tmp.replace(path)  # a new inode: snapshots holding the old file keep it
        versions = self._versions(client_id)
        earlier = [r for r in versions if r < round_num]
        keep = {round_num, max(earlier)} if earlier else {round_num}
        for r, old in versions.items():
            if r not in keep and r < round_num:
                old.unlink(missing_ok=True)

    def snapshot(self, target: str | Path, up_to_round: int) -> Path | None:
        """Freezes the versions written up to ``up_to_round`` into ``target`` (hard links),
        replacing a snapshot already there (a continued run writing its ``final.pt`` again).

        Returns ``target``, or None when no client had state (nothing to freeze, no folder).
        """
        target = Path(target)
        fresh, stale = target.with_name(target.name + ".new"), target.with_name(target.name + ".old")
        shutil.rmtree(fresh, ignore_errors=True)
        num_frozen = 0
        for folder in self.root.iterdir() if self.root.is_dir() else []:
            for path in folder.glob("*.pt"):
                parts = path.name.split(".")
                if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) <= up_to_round:
                    dest = fresh / folder.name / path.name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    _link_or_copy(path, dest)
                    num_frozen += 1
        if target.exists():  # swapped, not overwritten: links to the same files cannot be copied over
            shutil.rmtree(stale, ignore_errors=True)
            target.rename(stale)
        if num_frozen:  # the marker first: a snapshot in place always says which round it froze
            (fresh / SNAPSHOT_ROUND_FILE).write_text(f"{up_to_round}\n")
            fresh.rename(target)
        shutil.rmtree(stale, ignore_errors=True)
        return target if num_frozen else None

    def restore(self, snapshot: str | Path) -> None:
        """Fills this (empty) store from a snapshot, by hard links."""
        for path in Path(snapshot).glob("*/*.pt"):
            dest = self.root / path.parent.name / path.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(path, dest)

    def num_clients(self) -> int:
        """How many clients have any state (walks the directory: for tests and reports)."""
        return len({p.name.split(".")[0] for p in self.root.glob("*/*.pt")})


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, dest)
