"""raysim: a Ray-based, scalable, cross-device federated-learning simulator.

Usage:
    from raysim import load_jobs, run
    result = run(load_jobs("jobs/quickstart.yaml", ["engine.num_rounds=5"])[0])

The names below are imported on first use (PEP 562), so ``import raysim`` (and so every
``raysim`` command, before it imports what it uses) starts without torch, Ray or MLflow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raysim.aggregate import Aggregator, Gather, Sum, WeightedMean
    from raysim.algorithm import Algorithm, StagedAlgorithm
    from raysim.config import JobConfig, load_jobs
    from raysim.data.store import ClientStore, DatasetConfig, Examples
    from raysim.engine.loop import RunResult, run
    from raysim.errors import (
        CheckpointError,
        ClientError,
        ConfigError,
        DataError,
        NonFiniteError,
        RaysimError,
        ResourceError,
    )
    from raysim.measure.evaluate import evaluate
    from raysim.registry import register
    from raysim.services import Services
    from raysim.train.local import LocalTrainConfig, train_client, train_local
    from raysim.types import (
        ClientContext,
        ClientData,
        ClientResult,
        DataSpec,
        Metrics,
        Params,
        Payload,
        RunInfo,
        ServerState,
    )

_MODULES = {  # the module each public name is imported from
    "raysim.aggregate": ("Aggregator", "Gather", "Sum", "WeightedMean"),
    "raysim.algorithm": ("Algorithm", "StagedAlgorithm"),
    "raysim.config": ("JobConfig", "load_jobs"),
    "raysim.data.store": ("ClientStore", "DatasetConfig", "Examples"),
    "raysim.engine.loop": ("RunResult", "run"),
    "raysim.errors": (
        "CheckpointError",
        "ClientError",
        "ConfigError",
        "DataError",
        "NonFiniteError",
        "RaysimError",
        "ResourceError",
    ),
    "raysim.measure.evaluate": ("evaluate",),
    "raysim.registry": ("register",),
    "raysim.services": ("Services",),
    "raysim.train.local": ("LocalTrainConfig", "train_client", "train_local"),
    "raysim.types": (
        "ClientContext",
        "ClientData",
        "ClientResult",
        "DataSpec",
        "Metrics",
        "Params",
        "Payload",
        "RunInfo",
        "ServerState",
    ),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> object:
    """``raysim.run`` and the other public names, imported from their module on first use."""
    if name not in _HOME:
        raise AttributeError(f"module 'raysim' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "Aggregator",
    "Algorithm",
    "CheckpointError",
    "ClientContext",
    "ClientData",
    "ClientError",
    "ClientResult",
    "ClientStore",
    "ConfigError",
    "DataError",
    "DataSpec",
    "DatasetConfig",
    "Examples",
    "Gather",
    "JobConfig",
    "LocalTrainConfig",
    "Metrics",
    "NonFiniteError",
    "Params",
    "Payload",
    "RaysimError",
    "ResourceError",
    "RunInfo",
    "RunResult",
    "ServerState",
    "Services",
    "StagedAlgorithm",
    "Sum",
    "WeightedMean",
    "evaluate",
    "load_jobs",
    "register",
    "run",
    "train_client",
    "train_local",
]
