"""Sentinels: tiny processes that clean up after a driver killed outright (SIGKILL, the OOM killer),
which cannot clean up itself.

A sentinel blocks on a pipe from the driver. The driver's normal end writes ``STAND_DOWN`` and
closes the pipe; its death closes the pipe with nothing written (the kernel closes a dead process's
files), and only then does the sentinel do its duty:

- ``end-run URI RUN_ID``: end the MLflow run as KILLED, with an end time, if it is still RUNNING
  (else it shows RUNNING forever);
- ``unlink-segments PREFIX``: unlink the driver's shared-memory segments (``/dev/shm/PREFIX*``,
  ``raysim.runtime.shared_segments``), which would otherwise hold their memory until a reboot;
- ``reap-ray SESSION_DIR PID:START ...``: kill what is left of the local Ray node the driver
  started. Ray ties its GCS, raylet and workers to the driver (they die within seconds), but the
  node's dashboard and runtime-env agents then spend 60 s trying to report the raylet's death to
  the dead GCS. They are found as ``ray::`` processes with a log file open in the node's session
  folder (their environment is overwritten by their process title), the node's own processes by
  pid and start time (a reused pid is never killed).

Idle, a sentinel is one small Python process (~10 MiB): this file is run by path, never as part of
the ``raysim`` package, and imports MLflow or psutil only to do its duty. It runs in its own
session, so Ctrl-C or a kill of the driver's process group does not reach it.

Usage (driver side):
    sentinel = Sentinel.start("end-run", tracking_uri, run_id)
    ...
    sentinel.stand_down()  # the driver ended the run itself
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable

STAND_DOWN = b"stand down\n"


class Sentinel:
    """The driver's end of the pipe to a sentinel process."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @classmethod
    def start(cls, duty: str, *args: str) -> Sentinel:
        """Starts a sentinel for ``duty`` (``end-run``, ``unlink-segments`` or ``reap-ray``) with its
        arguments."""
        debug = bool(os.environ.get("RAYSIM_DEBUG"))
        process = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__), duty, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=None if debug else subprocess.DEVNULL,
            start_new_session=True,
        )
        return cls(process)

    def stand_down(self) -> None:
        """The driver cleaned up itself: the sentinel exits without doing anything."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(STAND_DOWN)
            stdin.close()
        except BrokenPipeError:  # it died already (killed along with something else)
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def end_run(uri: str, run_id: str) -> None:
    """Ends the MLflow run as KILLED, now, unless it ended already."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, "KILLED")


def reap_ray(session_dir: str, *processes: str) -> None:
    """Kills the node's own processes (``pid:start_time``) still alive, and every Ray process
    (``ray::...``) with a file open in the node's session folder: its agents and workers."""
    import psutil

    inside = os.path.join(session_dir, "")
    doomed = []
    for entry in processes:
        pid, start = entry.split(":")
        with contextlib.suppress(psutil.Error):  # gone already
            process = psutil.Process(int(pid))
            if abs(process.create_time() - float(start)) < 0.01:  # not a reused pid
                doomed.append(process)
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):  # gone, or another user's
            if process.name().startswith("ray::") and any(
                f.path.startswith(inside) for f in process.open_files()
            ):
                doomed.append(process)
    for process in doomed:
        with contextlib.suppress(psutil.Error):
            process.kill()


def unlink_segments(prefix: str) -> None:
    """Unlinks every shared-memory segment whose name begins with ``prefix`` (Linux: /dev/shm)."""
    import glob

    for path in glob.glob(os.path.join("/dev/shm", glob.escape(prefix) + "*")):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            os.unlink(path)


DUTIES: dict[str, Callable[..., None]] = {
    "end-run": end_run,
    "unlink-segments": unlink_segments,
    "reap-ray": reap_ray,
}


def main(argv: list[str]) -> int:
    duty, args = DUTIES[argv[1]], argv[2:]
    message = sys.stdin.buffer.read()  # blocks until the driver closes the pipe, or dies
    if message != STAND_DOWN:
        duty(*args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
