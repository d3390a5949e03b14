"""raysim's folder for what it writes (run directories, compared runs' files): RAYSIM_HOME, else .raysim."""

from __future__ import annotations

import os


def raysim_home() -> str:
    """RAYSIM_HOME, else ``.raysim`` (in the working directory)."""
    return os.environ.get("RAYSIM_HOME", ".raysim")
