"""The CLI's two consoles, shared by every command: results on stdout, errors on stderr.

Piped or redirected, stdout has no width: a run's name or a link is never wrapped or cut for a
file, ``grep`` or ``tee`` (``COLUMNS`` still sets one). Tables laid out for reading (``raysim
ls``) ask for ``READING_WIDTH`` there themselves.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console

PIPE_WIDTH = 10_000  # as wide as any line a command prints: nothing wraps
READING_WIDTH = 120  # a table sized to its width (expand=True) when piped


def width_for(stream: TextIO, environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """The console width for ``stream``: the terminal's (None: rich asks it), ``COLUMNS``, else
    ``PIPE_WIDTH``."""
    return None if stream.isatty() or "COLUMNS" in environ else PIPE_WIDTH


def reading_width(out: Console) -> int:
    """The width of a table that fills the console (``expand=True``): never the pipe's."""
    return READING_WIDTH if out.width >= PIPE_WIDTH else out.width


console = Console(width=width_for(sys.stdout))
err_console = Console(stderr=True)
