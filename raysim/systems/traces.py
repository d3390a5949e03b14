"""Trace files of the ``system:`` section: a JSON object whose ``clients`` maps client ids to entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError


def read_json(path: str, where: str) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{where}: cannot read {path}: {exc}"]) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("clients"), dict):
        raise ConfigError([f'{where}: {path} must hold a JSON object with a "clients" object'])
    return raw


def trace_clients(raw: dict[str, Any], path: str, where: str) -> dict[int, Any]:
    """The ``clients`` object with its keys as client ids."""
    try:
        return {int(key): value for key, value in raw["clients"].items()}
    except ValueError:
        raise ConfigError([f'{where}: {path}: client keys must be client ids ("0", "1", ...)']) from None


def per_client(
    listed: dict[int, Any], num_clients: int, missing: str, always: Any, where: str, path: str
) -> list[Any]:
    """One entry per client id: its own, or what ``missing`` says."""
    if not listed:
        raise ConfigError([f"{where}: {path} lists no client"])
    absent = [c for c in range(num_clients) if c not in listed]
    if absent and missing == "error":
        raise ConfigError(
            [
                f"{where}: {path} lists no entry for {len(absent)} of the {num_clients} "
                f"clients (first: {absent[:5]}); list them, or set missing: "
                f"cycle{' or always' if always is not None else ''}"
            ]
        )
    order = sorted(listed)
    if missing == "always":
        return [listed.get(c, always) for c in range(num_clients)]
    return [listed.get(c, listed[order[c % len(order)]]) for c in range(num_clients)]
