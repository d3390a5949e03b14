"""Test-wide settings: offline HuggingFace, MLflow in a temp SQLite, no Ray usage stats; one Ray."""

import os
import tempfile
from pathlib import Path

_TMP = tempfile.mkdtemp(prefix="raysim-tests-")
# Set before anything imports HF, MLflow or Ray: a failing hub lookup otherwise hangs ~50 s.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HOME": os.path.join(_TMP, "hf"),
    "MLFLOW_TRACKING_URI": f"sqlite:///{os.path.join(_TMP, 'mlflow.db')}",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "RAYSIM_CACHE": os.path.join(_TMP, "cache"),
    # test plugins (tests/plugins/algorithms/*.py); set before Ray starts, so workers see them too
    "RAYSIM_PLUGIN_PATH": str(Path(__file__).parent / "plugins"),
}.items():
    os.environ[key] = value

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (2 CPUs, no dashboard, listening on 127.0.0.1 only)."""
    import ray

    from raysim.runtime.ray_session import start_local_ray

    start_local_ray(num_cpus=2, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    """A fresh MLflow SQLite store for one test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
