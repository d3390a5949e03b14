"""Checkpoints: server state + ``round_num`` + the resolved config; resume or branch a run.

Usage:
    save_checkpoint(path, state, round_num=9, job=job)
    state, round_num, job_dict = load_checkpoint(path)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from raysim.errors import CheckpointError
from raysim.params import check_loadable
from raysim.types import ServerState

FORMAT = 1


def save_checkpoint(
    path: str | Path,
    state: ServerState,
    round_num: int,
    job_dict: dict[str, Any],
    state_dir: str | None = None,
) -> Path:
    """Writes atomically; ``round_num`` is the last completed round."""
    check_loadable({"opt_state": state.opt_state, "extra": state.extra}, "ServerState")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "round_num": round_num,
        "job": job_dict,
        "state_dir": state_dir,
        "state": {
            "params": state.params,
            "opt_state": state.opt_state,
            "extra": state.extra,
            "buffer_keys": sorted(state.buffer_keys),
        },
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_checkpoint(path: str | Path) -> tuple[ServerState, int, dict[str, Any], str | None]:
    """Returns (state, last completed round, job dict, client-state dir)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        raw = torch.load(path, weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable raysim checkpoint: {exc}") from exc
    return parse_checkpoint(raw, path)


def is_checkpoint(raw: Any) -> bool:
    """Whether a loaded file's content looks like a raysim checkpoint (of any format version)."""
    return isinstance(raw, dict) and "format" in raw and "state" in raw


def parse_checkpoint(raw: Any, path: str | Path) -> tuple[ServerState, int, dict[str, Any], str | None]:
    """``load_checkpoint`` of content already read from ``path``."""
    try:
        if raw.get("format") != FORMAT:
            raise CheckpointError(f"{path}: checkpoint format {raw.get('format')!r}, expected {FORMAT}")
        s = raw["state"]
        state = ServerState(
            params=s["params"],
            opt_state=s["opt_state"],
            extra=s["extra"],
            buffer_keys=frozenset(s["buffer_keys"]),
        )
        return state, int(raw["round_num"]), raw["job"], raw.get("state_dir")
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable raysim checkpoint: {exc}") from exc


def check_compatible(state: ServerState, params: dict[str, torch.Tensor], path: str) -> None:
    """The checkpoint's params must match the job's model, name for name and shape for shape."""
    own = {k: tuple(v.shape) for k, v in params.items()}
    saved = {k: tuple(v.shape) for k, v in state.params.items()}
    if own != saved:
        diff = sorted(set(own.items()) ^ set(saved.items()))[:4]
        raise CheckpointError(f"{path} does not fit this job's model (first differences: {diff})")
