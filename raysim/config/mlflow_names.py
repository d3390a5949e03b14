"""What MLflow takes as a param or tag key, checked before a run starts: a key MLflow refuses
otherwise fails the run part-way, after its MLflow run began.

MLflow's rule (``mlflow.utils.validation._validate_param_name``, ``path_not_unique`` and
``MAX_ENTITY_KEY_LENGTH``; tests/unit/config/test_mlflow_names.py holds the two side by side):
letters, digits, ``_ - . / :`` and spaces only, a key read as a path must name itself (no ``..``
part, no leading, trailing or doubled ``/``), and at most 250 characters. Values need no check:
MLflow cuts a long one to its limit.

Usage:
    key_problem("sweep.grid.a/../b")  # "MLflow reads keys as paths, and this one resolves to 'b'"
"""

from __future__ import annotations

import posixpath
import re

MAX_KEY_LENGTH = 250
_KEY_CHARACTERS = re.compile(r"[/\w.\- :]*")


def key_problem(key: str) -> str | None:
    """Why MLflow refuses ``key`` as a param or tag key; None when it takes it."""
    if not _KEY_CHARACTERS.fullmatch(key):
        return "MLflow keys hold only letters, digits, '_', '-', '.', '/', ':' and spaces"
    path = posixpath.normpath(key)
    if path != key or path == "." or path.startswith(("..", "/")):
        return f"MLflow reads keys as paths, and this one resolves to {path!r}"
    if len(key) > MAX_KEY_LENGTH:
        return f"{len(key)} characters, over MLflow's {MAX_KEY_LENGTH}"
    return None
