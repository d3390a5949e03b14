"""A stop request (SIGTERM): noted once, and honoured wherever the run can stop.

Ctrl-C is not noted here: it stays Python's KeyboardInterrupt, which the CLI turns into exit 130
(``raysim.cli.main``); ``raise_stop_request`` hands it on where broad ``except`` blocks catch it.

The driver's SIGTERM handler raises SystemExit where the signal lands, and that exit can be lost:
Python hands it on wrapped in a RuntimeError when it lands in a class body being built (torch
and aiohttp build classes as they import lazily), and ignores it in a garbage-collection
callback. So the handler also notes the request here (``note_stop_request``); the engine honours
it at the next client, at each round's end and once more before the run ends FINISHED
(``honour_stop_request``), and code that catches broad errors hands a wrapped stop on
(``raise_stop_request``). Ray changes the exit itself where it lands in ``ray.get`` or
``ray.wait``: it runs the handler, catches its SystemExit(143) and raises SystemExit(1); the run
ends with the code the stop asked for all the same (``exit_as_requested``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_requested: list[int] = []  # the exit code of a stop asked for in this process (at most one)


def note_stop_request(exit_code: int) -> None:
    """Notes that this process was asked to stop, with the exit code it should end with."""
    if not _requested:
        _requested.append(exit_code)


def honour_stop_request() -> None:
    """Ends the run (SystemExit, through every ``finally``) when a stop was asked for."""
    if _requested:
        raise SystemExit(_requested[0])


@contextmanager
def exit_as_requested() -> Iterator[None]:
    """An exit that leaves this block after a stop was asked for carries the stop's exit code."""
    try:
        yield
    except SystemExit:
        honour_stop_request()
        raise


def clear_stop_request() -> None:
    """Forgets a stop request (a process that goes on after handling one: tests)."""
    _requested.clear()


def raise_stop_request(exc: BaseException) -> None:
    """Re-raises a stop request (SIGTERM's SystemExit, Ctrl-C's KeyboardInterrupt) that arrived
    wrapped in ``exc``. One landing in a class body being built (torch and aiohttp build classes
    as they import lazily) comes back as ``RuntimeError: Error calling __set_name__``, its cause
    the stop. Code that catches broad errors calls this first: a stop must stop, never count as a
    failed client or a broken log stream."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (SystemExit, KeyboardInterrupt)):
            raise cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
