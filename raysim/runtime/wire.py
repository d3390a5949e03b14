"""What crosses between the driver and a worker: plain values that pickle (Ray ships them).

A worker is built from ``WorkerSetup``; each round it is told ``RoundOptions`` and answers with a
``WorkerReport``; ``map_clients`` sends it a ``MapRequest``. Those two requests are the engine's
verbs' own (``raysim.services``: plugins and probes write them too), checked on the driver.
"""

from __future__ import annotations

import pickle
import sysconfig
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from raysim.types import ClientFailure, RoundOutput

if TYPE_CHECKING:
    from raysim.aggregate import Partial
    from raysim.registry import Entry


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs to build itself; plain values only (it crosses processes)."""

    job: dict[str, Any]  # JobConfig.to_dict(): the worker re-validates, plugins load locally
    store_path: str
    state_dir: str
    transfer_stores: dict[str, str] = field(default_factory=dict)  # evaluation-only datasets
    device: str = "cpu"
    num_threads: int = 1
    gpu_memory_fraction: float | None = None
    # plugins registered outside raysim and its plugin files (a notebook's): classes, not names
    plugins: tuple[Entry, ...] = ()


# One worker's answer for one round: its share of the round in the round's own shape, its
# partial as the aggregate and its times alone (``merge_reports`` makes the round's of them).
WorkerReport: TypeAlias = "RoundOutput[Partial]"


# Code a plugin calls into: raysim itself, the standard library and installed packages (torch)
_LIBRARIES = (
    str(Path(__file__).resolve().parents[1]),
    *{sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")},
)


def raised_at(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``exc``'s traceback in the plugin's own
    code (outside raysim and installed packages; else the innermost frame), the file relative to
    the working directory where it lies below it. A failure shipped from a Ray worker loses its
    traceback, so this is what names the plugin's line on the driver."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [frame for frame in frames if not frame.filename.startswith(_LIBRARIES)]
    if not frames:
        return ""
    frame = (own or frames)[-1]
    path = Path(frame.filename)
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return f"{shown}:{frame.lineno} in {frame.name}"


def client_failure(client_id: int, position: int, exc: Exception) -> ClientFailure:
    """A client's failure as it crosses to the driver: the exception (``shippable``) and the
    plugin's line it was raised at."""
    return ClientFailure(client_id, position, shippable(exc), raised_at=raised_at(exc))


def shippable(exc: Exception) -> Exception:
    """The exception itself when it pickles (it crosses to the driver), else one that keeps its
    type name, message and traceback text."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        trace = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{type(exc).__name__}: {exc} (unpicklable; traceback follows)\n{trace}")
