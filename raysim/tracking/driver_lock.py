"""A run folder's ``driver.lock``: of the drivers that would continue one run, exactly one does.

Continuing a run takes its folder by creating ``driver.lock`` with O_CREAT|O_EXCL (atomic on a
local or NFSv3+ file system, unlike a look at the MLflow run's status followed by a write). The
file names its owner, ``pid 4242 on node-7, started 2026-11-27 15:59:21 UTC``; the driver holds it
for the run's life and removes it at its end.

A driver killed with SIGKILL leaves its lock behind. A later claim takes such a lock over when
its owner provably no longer runs: it names this host, and no process with its pid and start
time is alive (a pid reused by another process does not count). Claimers decide about an
existing lock one at a time, under an exclusive ``flock`` of the file, and the winner rewrites
it in place: of two claimers racing over a stale lock, the second finds the first's name in it.
Any other lock is refused, naming its owner (on another host: delete it once no driver runs
there).

Usage:
    held_by = claim_run_folder(run_dir)  # None: this driver holds run_dir/driver.lock
    ...
    release_run_folder(run_dir)
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
from datetime import datetime, timezone
from pathlib import Path

DRIVER_LOCK = "driver.lock"  # in a run folder while a driver continues it
_OWNER = re.compile(r"pid (?P<pid>\d+) on (?P<host>[^\s,]+)(?:, started (?P<started>.+ UTC))?")
_STARTED_FORMAT = "%Y-%m-%d %H:%M:%S UTC"
# A process's start time as psutil reads it drifts with the boot time the kernel reports (NTP
# steps the clock): a live owner's differs from its recorded one by less than this.
_START_TOLERANCE_S = 2.0
_ATTEMPTS = 3  # a lock released and taken again while this claim looked at it: look again
_owner_lines: dict[int, str] = {}  # this process's owner line, computed once (by pid: forks differ)


def claim_run_folder(run_dir: Path) -> str | None:
    """Takes ``run_dir`` for this driver: None when it did, else who holds it and what to do.

    A lock whose owner provably no longer runs (this host, no such process) is taken over.
    """
    lock = run_dir / DRIVER_LOCK
    for _ in range(_ATTEMPTS):
        if _create(lock):
            return None
        try:
            held_by = _take_over_if_stale(lock)
        except FileNotFoundError:  # released in between: try to create it again
            continue
        except OSError as exc:  # another user's file, a file system without flock: never taken over
            return f"{lock} cannot be checked ({exc.strerror}): delete it if no driver runs there"
        return held_by or None
    return f"{lock} changed hands {_ATTEMPTS} times while this driver tried to take it"


def release_run_folder(run_dir: Path) -> None:
    """Removes ``run_dir``'s lock if this driver holds it (never another driver's)."""
    lock = run_dir / DRIVER_LOCK
    try:
        if lock.read_text().strip() == this_driver():
            lock.unlink()
    except OSError:  # no lock: nothing to release
        pass


def this_driver() -> str:
    """This process as a lock names its owner: pid, host and start time."""
    pid = os.getpid()
    if pid not in _owner_lines:
        import psutil  # here: only a resume that continues a run needs it

        started = datetime.fromtimestamp(psutil.Process(pid).create_time(), timezone.utc)
        _owner_lines[pid] = f"pid {pid} on {socket.gethostname()}, started {started:{_STARTED_FORMAT}}"
    return _owner_lines[pid]


def _create(lock: Path) -> bool:
    """Creates ``lock`` naming this driver; False when it exists."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as file:  # a claimer that reads it empty meanwhile refuses it
        file.write(this_driver() + "\n")
    return True


def _take_over_if_stale(lock: Path) -> str:
    """Rewrites an existing ``lock`` to name this driver when its owner no longer runs: "" when it
    did, else who holds it. One claimer at a time decides (an exclusive flock of the file).

    Raises:
        FileNotFoundError: the lock was released meanwhile.
    """
    with open(lock, "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        if os.fstat(file.fileno()).st_ino != os.stat(lock).st_ino:
            raise FileNotFoundError(lock)  # released, and maybe taken again, before the flock
        owner = file.read().strip()
        why_held = _why_held(owner, lock)
        if why_held:
            return why_held
        file.seek(0)
        file.truncate()
        file.write(this_driver() + "\n")
        file.flush()
        return ""


def _why_held(owner: str, lock: Path) -> str:
    """Why ``lock``, naming ``owner``, cannot be taken over; "" when its owner no longer runs."""
    found = _OWNER.fullmatch(owner)
    if not owner:  # a driver creating it, or one killed in that instant
        return f"{lock} names no owner yet: delete it if no driver runs there"
    if found is None:
        return f"{lock} names no owner raysim can check ({owner[:80]!r}): delete it if no driver runs there"
    if found["host"] != socket.gethostname():
        return (
            f"{owner} holds {lock}: a driver on another host; "
            f"if none runs on {found['host']} any more, delete the file"
        )
    started = found["started"]
    if _is_running(int(found["pid"]), None if started is None else _timestamp(started)):
        return f"{owner} holds {lock}, and that process is running"
    return ""


def _is_running(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` of this host runs, and is the one started at ``started`` when given."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return False
        return started is None or abs(process.create_time() - started) < _START_TOLERANCE_S
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process with that pid: not provably dead
        return True


def _timestamp(started: str) -> float:
    return datetime.strptime(started, _STARTED_FORMAT).replace(tzinfo=timezone.utc).timestamp()
