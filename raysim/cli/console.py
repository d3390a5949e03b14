"""The CLI's two consoles, shared by every command: results on stdout, errors on stderr."""

from __future__ import annotations

import sys

from rich.console import Console

console = Console(width=None if sys.stdout.isatty() else 120)  # a pipe gets 120 columns, not 80
err_console = Console(stderr=True)
