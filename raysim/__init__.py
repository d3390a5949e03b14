"""raysim: a Ray-based, scalable, cross-device federated-learning simulator.

Usage:
    from raysim import load_jobs, run
    result = run(load_jobs("jobs/quickstart.yaml", ["engine.num_rounds=5"])[0])
"""

from raysim.aggregate import Aggregator, Gather, Sum, WeightedMean
from raysim.algorithm import Algorithm
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
    "Sum",
    "WeightedMean",
    "evaluate",
    "load_jobs",
    "register",
    "run",
    "train_client",
    "train_local",
]
