"""Checkpoints: server state + ``round_num`` + the resolved config; resume or branch a run.

Every reader goes through ``parse_state``, which checks the format: ``read_checkpoint`` and
``load_checkpoint`` (resuming: also the job, the client-state snapshot and the MLflow run that
wrote it), ``read_state`` (evaluating a checkpoint or reading a
run's earlier rounds: the server state alone) and ``raysim.models.weights`` (``init_from``).

Usage:
    save_checkpoint(path, state, round_num=9, job_dict=job.to_dict(), state_dir=snapshot,
                    run={"run_id": "3f2a...", "tracking_uri": "sqlite:///..."})
    state, round_num, job_dict, state_dir = load_checkpoint(path)
    read_checkpoint(path).run  # {"run_id": ..., "tracking_uri": ...}, or None
    state, round_num = read_state(path)
    CheckpointTrail(path, round_num, state).state_after(7)  # round_00007.pt beside it
    round_of_name("round_00007.pt")  # 7; None for final.pt
"""

from __future__ import annotations

import pickle
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raysim.errors import CheckpointError
from raysim.params import check_loadable
from raysim.snapshots import check_snapshot, checked_fingerprint, manifest_digest
from raysim.stored import plain
from raysim.types import ServerState

FORMAT = 1
_KEYS = ("format", "state", "round_num", "job")  # what every checkpoint holds


_ROUND_NAME = re.compile(r"^round_(\d+)\.pt$")


def round_checkpoint_name(round_num: int) -> str:
    """The file a run's checkpoint after ``round_num`` gets (``engine.checkpoint_every``)."""
    return f"round_{round_num:05d}.pt"


def snapshot_path(checkpoint: Path, round_num: int) -> Path:
    """Where the client-state snapshot of ``checkpoint`` after ``round_num`` goes: a name of its
    own per round, so rewriting ``final.pt`` never touches the snapshot the old one names."""
    return checkpoint.with_name(f"{checkpoint.stem}.client_state.r{round_num}")


def drop_other_snapshots(checkpoint: Path, keep: Path | None) -> None:
    """Removes the snapshots beside ``checkpoint`` that it no longer names (an earlier write's, or
    one an interrupted write left behind); only once the checkpoint naming ``keep`` is in place."""
    for old in checkpoint.parent.glob(f"{checkpoint.stem}.client_state*"):
        if keep is None or old.absolute() != keep.absolute():
            shutil.rmtree(old, ignore_errors=True)


def round_of_name(name: str) -> int | None:
    """The round a per-round checkpoint file is named after (``round_checkpoint_name``'s
    inverse); None for any other name (``final.pt``)."""
    match = _ROUND_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class CheckpointTrail:
    """The checkpoint a run resumes from, and the per-round checkpoints its run left beside it.

    A plugin's ``resume_state`` reads the earlier rounds' server states from it: IMA branching
    from a FedAvg checkpoint fills its window with the parent's last P models.
    """

    path: Path
    last_round: int  # the last round the checkpoint completed
    state: ServerState  # the checkpoint's own server state

    def state_after(self, round_num: int) -> ServerState:
        """The server state after ``round_num`` (at most ``last_round``) of the same run.

        Raises:
            CheckpointError: its checkpoint is not beside this one (the run did not write it).
        """
        if round_num == self.last_round:
            return self.state
        if not 0 <= round_num < self.last_round:
            raise CheckpointError(f"{self.path} ends after round {self.last_round}, not {round_num}")
        sibling = self.path.parent / round_checkpoint_name(round_num)
        if not sibling.is_file():
            raise CheckpointError(
                f"no checkpoint of round {round_num} beside {self.path} (expected {sibling})"
            )
        state, saved_round = read_state(sibling)
        if saved_round != round_num:
            raise CheckpointError(f"{sibling} holds round {saved_round}, not {round_num}")
        return state


def save_checkpoint(
    path: str | Path,
    state: ServerState,
    round_num: int,
    job_dict: dict[str, Any],
    state_dir: str | None = None,
    run: dict[str, str] | None = None,
    privacy: dict[str, Any] | None = None,
    selection: dict[str, Any] | None = None,
    downlink: dict[str, Any] | None = None,
    asynchrony: dict[str, Any] | None = None,
    time_to_target: list[float] | None = None,
) -> Path:
    """Writes atomically; ``round_num`` is the last completed round.

    ``privacy`` is the privacy accounting's state (central DP's ``raysim.privacy.ledger.LedgerState``
    and the clients' counts, as plain values); a resumed run's accountant goes on from it.
    ``selection`` is a guided selection's state and the simulated clock's rounds
    (``raysim.engine.selection_setup``), as plain values. ``downlink`` is the server's state for
    ``compression.download`` (``raysim.compress.downlink``: the public model, tensors).
    ``asynchrony`` is an asynchronous run's clock, clients in flight and the model versions they
    need (``raysim.engine.async_state``). ``time_to_target`` lists the
    ``evaluation.time_to_target`` values reached: a resumed run logs none of them again.

    ``run`` names the MLflow run that wrote the checkpoint (``run_id``, ``tracking_uri``):
    resuming from it continues that run. Checkpoints written before it existed load as ``None``.

    ``state_dir`` is the client-state snapshot the checkpoint needs (None: no client has state).
    Inside the checkpoint's folder it is stored relative to it, so that moving the output folder,
    or resuming from another working directory, still finds it. The digest of its manifest is
    recorded with it (``raysim.snapshots``): a resume refuses a manifest gone or changed.
    """
    extra = plain(state.extra)  # the plugin's dataclass as the dict of its fields
    check_loadable({"opt_state": state.opt_state, "extra": extra}, "ServerState")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "round_num": round_num,
        "job": job_dict,
        "state_dir": None if state_dir is None else _relative_to(path.parent, Path(state_dir)),
        "snapshot_manifest": None if state_dir is None else manifest_digest(Path(state_dir)),
        "run": run,
        "privacy": privacy,
        "selection": selection,
        "downlink": downlink,
        "asynchrony": asynchrony,
        "time_to_target": time_to_target,
        "state": {
            "params": state.params,
            "opt_state": state.opt_state,
            "extra": extra,
            "buffer_keys": sorted(state.buffer_keys),
        },
    }
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(payload, tmp)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # a torn file; the previous checkpoint stays as it was
        if isinstance(exc, (OSError, RuntimeError)):  # a full disk: torch's writer raises RuntimeError
            raise unwritten(path, exc) from exc
        raise
    tmp.replace(path)
    return path


def unwritten(path: Path, exc: BaseException) -> CheckpointError:
    """The error for a checkpoint (or its client-state snapshot) that could not be written: why,
    and how much space is left."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:200]
    free = shutil.disk_usage(path.parent).free
    return CheckpointError(
        f"could not write the checkpoint {path} ({reason}; {free / 2**20:,.0f} MiB free there); "
        f"the previous {path.name}, if any, is kept: free some space and resume from it"
    )


@dataclass(frozen=True)
class Checkpoint:
    """Everything resuming from a checkpoint file needs."""

    path: Path
    state: ServerState
    round_num: int  # the last completed round
    job: dict[str, Any]  # the resolved config of the run that wrote it
    state_dir: str | None  # its client-state snapshot; None: no client had state
    run: dict[str, str] | None  # the MLflow run that wrote it; None: untracked, or an older file
    privacy: Any = None  # the privacy accounting's state; None: no privacy, or an older file
    selection: Any = None  # engine.selection's state; None: uniform, or an older file
    downlink: Any = None  # compression.download's state; None: sent whole, or an older file
    asynchrony: Any = None  # engine.asynchrony's state; None: a synchronous run, or an older file
    time_to_target: Any = None  # the target values reached; None: no targets, or an older file


def read_checkpoint(path: str | Path, with_client_state: bool = True) -> Checkpoint:
    """Reads a checkpoint to resume from (``with_client_state``) or to evaluate (without: its
    ``state_dir`` is None, its snapshot not looked for; evaluation never reads client state).

    Raises:
        CheckpointError: the file is missing or unreadable, or the client-state snapshot it
            needs is missing (resuming without it would silently reset every client's state),
            froze another round (a mix of two writes would silently resume a wrong model), or
            does not hold exactly the files its manifest lists, unchanged (``check_snapshot``).
    """
    raw = _load(Path(path))
    state, round_num = parse_state(raw, path)
    state_dir = _find_state_dir(Path(path), raw.get("state_dir")) if with_client_state else None
    if state_dir is not None:
        check_snapshot(Path(path), Path(state_dir), round_num, raw.get("snapshot_manifest"))
    run = raw.get("run") if isinstance(raw.get("run"), dict) else None
    privacy = raw.get("privacy")  # checked by the run that resumes (raysim.privacy.run_privacy)
    selection = raw.get("selection")  # checked by the run that resumes (raysim.engine.selection_setup)
    downlink = raw.get("downlink")  # None: the broadcast went whole, or an older file
    asynchrony = raw.get("asynchrony")  # checked by the run that resumes (raysim.engine.async_state)
    return Checkpoint(
        Path(path),
        state,
        round_num,
        raw["job"],
        state_dir,
        run,
        privacy,
        selection,
        downlink,
        asynchrony,
        raw.get("time_to_target"),
    )


def load_checkpoint(path: str | Path) -> tuple[ServerState, int, dict[str, Any], str | None]:
    """Returns (state, last completed round, job dict, client-state snapshot or None); see
    ``read_checkpoint``."""
    found = read_checkpoint(path)
    return found.state, found.round_num, found.job, found.state_dir


def read_state(path: str | Path) -> tuple[ServerState, int]:
    """(server state, last completed round) of a checkpoint file: what evaluating it or reading a
    run's earlier rounds needs. Its client-state snapshot is neither needed nor looked for.

    Raises:
        CheckpointError: the file is missing, unreadable or not a raysim checkpoint of this format.
    """
    return parse_state(_load(Path(path)), path)


def is_checkpoint(raw: Any) -> bool:
    """Whether a loaded file's content looks like a raysim checkpoint (of any format version)."""
    return isinstance(raw, dict) and "format" in raw and "state" in raw


def parse_state(raw: Any, path: str | Path) -> tuple[ServerState, int]:
    """(server state, last completed round) of checkpoint content already read from ``path``.

    Raises:
        CheckpointError: another format version, or content that is no raysim checkpoint.
    """
    if not isinstance(raw, dict):
        raise CheckpointError(
            f"{path} is a torch file but not a raysim checkpoint: it holds a {type(raw).__name__}, "
            f"not a dict with {', '.join(map(repr, _KEYS))}"
        )
    missing = [key for key in _KEYS if key not in raw]
    if missing:
        held = ", ".join(map(repr, list(raw)[:4])) + (", ..." if len(raw) > 4 else "")
        raise CheckpointError(
            f"{path} is a torch file but not a raysim checkpoint (no {', '.join(map(repr, missing))}; "
            f"it holds {held or 'nothing'}): pass a final.pt or round_NNNNN.pt a raysim run wrote"
        )
    if raw["format"] != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {raw['format']!r}, expected {FORMAT}")
    if not isinstance(raw["job"], dict):  # --resume and raysim eval rebuild the run from it
        raise CheckpointError(
            f"{path}: its 'job' entry is a {type(raw['job']).__name__}, not the run's config (a "
            f"mapping): edited or damaged; use another checkpoint of the run"
        )
    try:
        state, round_num = server_state(raw["state"]), int(raw["round_num"])
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable raysim checkpoint: {exc}") from exc
    if round_num < -1:  # -1: a run that logged no round (``finish``), resumed from round 0
        raise CheckpointError(
            f"{path} says it ends after round {round_num}, which no run writes (edited or damaged); "
            f"use another checkpoint of the run"
        )
    return state, round_num


def _load(path: Path) -> Any:
    """A checkpoint file's content, as ``torch.load`` gives it (tensors only: weights_only)."""
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty, not a raysim checkpoint (an interrupted copy?)")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive: this is something else
        raise CheckpointError(f"{path} is not a torch file (or a truncated one), so not a raysim checkpoint")
    check_archive(path)
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # a damaged archive, or objects beyond tensors and plain containers
        raise CheckpointError(
            f"{path} is a torch file but not a readable raysim checkpoint: {unreadable(exc)}"
        ) from exc


def unreadable(exc: Exception) -> str:
    """Why ``torch.load`` could not read a file, in one line: torch's own texts run to pages, and
    for a file that is no torch file they advise loading it with ``weights_only=False``."""
    if isinstance(exc, pickle.UnpicklingError):
        return "it is no torch file, or holds objects beyond tensors (a damaged copy?)"
    if isinstance(exc, EOFError):
        return "it ends early (a truncated copy?)"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return first.split(". ")[0][:200]  # its first sentence (a truncated archive's is miniz's)


def check_archive(
    path: Path, remedy: str = "use another copy, or an earlier round_NNNNN.pt beside it"
) -> None:
    """Checks every entry of a torch file (a zip archive) against the CRC-32 the archive recorded
    when it was written: ``torch.load`` does not, so a flipped byte would load as a slightly
    different model. It reads the whole file once: 0.03 s for a 100 MB checkpoint from the page
    cache, where torch.load itself takes 0.06 s (measured on the team's 2-core machine).

    Raises:
        CheckpointError: an entry does not match its CRC, or the archive cannot be read.
    """
    checked_fingerprint(path, remedy)


def server_state(saved: dict[str, Any]) -> ServerState[Any]:
    """A ``ServerState`` from a checkpoint's ``state`` entry; its ``extra`` stays plain (the dict of
    the plugin's fields, or {} / None where it kept none) until resuming rebuilds it after the
    plugin's ``init`` (``raysim.engine.resumed_state.initial_state``)."""
    return ServerState(
        params=saved["params"],
        opt_state=saved["opt_state"],
        extra=saved["extra"],
        buffer_keys=frozenset(saved["buffer_keys"]),
    )


def _relative_to(folder: Path, target: Path) -> str:
    """``target`` relative to ``folder`` when it lies inside it, else absolute."""
    target = target.absolute()
    try:
        return str(target.relative_to(folder.absolute()))
    except ValueError:
        return str(target)


def _find_state_dir(path: Path, stored: str | None) -> str | None:
    """The snapshot named by a checkpoint, resolved against the checkpoint's folder."""
    if stored is None:
        return None
    found = path.parent / stored  # an absolute ``stored`` stays as it is
    beside = path.parent / Path(stored).name
    if not found.resolve().is_relative_to(path.parent.resolve()):
        if not Path(stored).is_absolute() or not beside.is_dir():
            raise CheckpointError(
                f"{path} names its client-state snapshot {stored!r}, which lies outside the checkpoint's "
                f"folder {path.parent}; a checkpoint's snapshot lies inside its folder (this file was "
                f"not written by raysim, or was edited)"
            )
        found = beside  # an older file that named it by an absolute path, since moved with it
    if not found.is_dir() and beside.is_dir():
        found = beside  # older checkpoints stored a path relative to the run's working directory
    if not found.is_dir():
        raise CheckpointError(
            f"{path} needs its client-state snapshot {found}, which is missing; copy the folder "
            f"{Path(stored).name}/ written beside the checkpoint along with it (without it every "
            f"client's state, SCAFFOLD's control variates say, would silently start from scratch)"
        )
    return str(found)


def check_compatible(state: ServerState, params: dict[str, torch.Tensor], path: str) -> None:
    """The checkpoint's params must match the job's model, name for name and shape for shape."""
    own = {k: tuple(v.shape) for k, v in params.items()}
    saved = {k: tuple(v.shape) for k, v in state.params.items()}
    if own != saved:
        diff = sorted(set(own.items()) ^ set(saved.items()))[:4]
        raise CheckpointError(f"{path} does not fit this job's model (first differences: {diff})")
