"""raysim: a Ray-based, scalable, cross-device federated-learning simulator.

Usage (docs/python-api.md):
    import raysim
    sections = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    result = raysim.run(raysim.job(sections, ["engine.num_rounds=2"]))  # or a job file's path
    raysim.runs()                                   # a DataFrame of the store's runs
    raysim.compare("raysim", result).figure()       # raysim compare's table and curves

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
    from raysim.config.files import job
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
    from raysim.results.compared import Comparison
    from raysim.results.frames import compare, report, runs
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
    "raysim.config.files": ("job",),
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
    "raysim.results.compared": ("Comparison",),
    "raysim.results.frames": ("compare", "report", "runs"),
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
    "Comparison",
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
    "compare",
    "evaluate",
    "job",
    "load_jobs",
    "register",
    "report",
    "run",
    "runs",
    "train_client",
    "train_local",
]
