"""Command-line values checked as argparse reads them: a bad one is argparse's one line, exit 2.

Usage:
    parser.add_argument("--limit", type=positive_int)
    parser.add_argument("--target", type=finite_float)
    parser.add_argument("--output-dir", type=output_folder)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def positive_int(text: str) -> int:
    """A whole number of at least 1 (``--limit 0`` or ``-1`` would show nothing, or everything)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number of at least 0 (``--at-round 0``: the initial model; no run has round -1)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def finite_float(text: str) -> float:
    """A finite number (a target of nan or inf is never reached, and says nothing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def output_folder(text: str) -> str:
    """A folder the command can make its files in: not a file, nor under one, and writable
    (``raysim.engine.preflight.check_output_dir``), checked before any store is read."""
    from raysim.engine.preflight import check_output_dir
    from raysim.errors import ResourceError

    try:
        check_output_dir(Path(text))
    except ResourceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
