"""What the ``raysim`` process sets up for itself as a driver: a console free of Ray's and MLflow's
start-up notices, and a SIGTERM that ends a run through its normal clean-up.

``RAYSIM_DEBUG=1`` keeps every notice (and tracebacks, see ``raysim.cli.main``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from raysim.stop_request import note_stop_request

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM
_unraisablehook = sys.unraisablehook  # the hook before ``_drop_lost_exit``: every other report


def quiet_startup() -> None:
    """MLflow logs at WARNING and above only (no "Creating initial MLflow database tables" and
    alembic lines on a new SQLite store); warnings still show. MLflow reads the level when it is
    first imported, which the commands do lazily, after this. A level the user set stays."""
    if not os.environ.get("RAYSIM_DEBUG"):
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def exit_on_sigterm() -> None:
    """SIGTERM (``kill``, a scheduler's stop) raises SystemExit in the main thread: the run's
    ``finally`` shuts its workers down and ends its MLflow run as KILLED (``init_ray`` puts this
    handler back after Ray's core replaced it)."""

    def terminate(signum: int, frame: FrameType | None) -> None:
        note_stop_request(SIGTERM_EXIT_CODE)  # honoured at the next client or round end if this
        sys.exit(SIGTERM_EXIT_CODE)  # exit is lost where it lands (raysim.stop_request)

    if threading.current_thread() is threading.main_thread():  # signals go to the main thread only
        signal.signal(signal.SIGTERM, terminate)
        if sys.unraisablehook is not _drop_lost_exit:
            global _unraisablehook
            _unraisablehook, sys.unraisablehook = sys.unraisablehook, _drop_lost_exit


def _drop_lost_exit(unraisable: Any) -> None:
    """Python cannot raise the handler's exit where it lands in a destructor, a weakref or
    garbage-collection callback, or the interpreter's shutdown: it printed "Exception ignored
    in ..." and the exit's traceback. The stop was noted and is honoured at the next client or
    round end, so that report alone is dropped."""
    exc = unraisable.exc_value
    if not (isinstance(exc, SystemExit) and exc.code == SIGTERM_EXIT_CODE):
        _unraisablehook(unraisable)
