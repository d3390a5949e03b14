"""Per-client persistent state (SCAFFOLD's c_i, FedDyn's h_i, FuseFL's private blocks) on disk.

State lives outside the workers, so it survives worker restarts and scales to many clients. Each
client has two slots, written alternately by round parity: a retried client reads the state from
before the round even if the failed attempt already wrote, so retries are idempotent.

Usage:
    store = ClientStateStore(tmp_dir)
    store.put(client_id=7, round_num=3, state={"c": tensor})
    store.get(client_id=7, before_round=4)        # -> {"c": tensor}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from raysim.checkpoint import check_loadable
from raysim.errors import DataError


class ClientStateStore:
    """A directory of ``<shard>/<client_id>.<slot>.pt`` files (torch.save of plain values)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, client_id: int, slot: int) -> Path:
        return self.root / f"{client_id % 1024:04d}" / f"{client_id}.{slot}.pt"

    def get(self, client_id: int, before_round: int) -> Any | None:
        """The newest state this client wrote in a round before ``before_round``, or None."""
        best_round, best = -1, None
        for slot in (0, 1):
            path = self._path(client_id, slot)
            if not path.exists():
                continue
            try:
                saved = torch.load(path, weights_only=True)
            except Exception as exc:  # a truncated file: say which client, keep the cause
                raise DataError(f"client state file {path} is unreadable: {exc}") from exc
            if best_round < saved["round_num"] < before_round:
                best_round, best = saved["round_num"], saved["state"]
        return best

    def put(self, client_id: int, round_num: int, state: Any) -> None:
        """Saves the state written in ``round_num`` (atomically: write, then rename).

        Raises:
            TypeError: the state holds something a weights-only load cannot read back.
        """
        check_loadable(state, f"client {client_id}'s state")
        path = self._path(client_id, round_num % 2)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"round_num": round_num, "state": state}, tmp)
        tmp.replace(path)

    def num_clients(self) -> int:
        """How many clients have any state (walks the directory: for tests and reports)."""
        return len({p.name.split(".")[0] for p in self.root.glob("*/*.pt")})
