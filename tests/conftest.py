"""Test-wide settings: offline HuggingFace, MLflow in a temp SQLite, no Ray usage stats; one Ray a process.

`make test` runs the suite in 3 processes (pytest-xdist, each test file whole in one), so a test
never assumes it is alone on the machine: a port it serves on is a free one (or, fixed, one that
no other test file uses), its Ray processes are found by its own folder, never by name, and
`ray stop` is never called. Each process has its own Ray (``ray_local``) and its own temporary
folder below.
"""

import atexit
import contextlib
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
from pathlib import Path

_TMP = tempfile.mkdtemp(prefix="raysim-tests-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # one a test process: 4 a `make test`
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
    # what a command writes by default (reports, compared runs, one-shot caches): not the checkout
    "RAYSIM_HOME": os.path.join(_TMP, "home"),
    # test plugins (tests/plugins/algorithms/*.py); set before Ray starts, so workers see them too
    "RAYSIM_PLUGIN_PATH": str(Path(__file__).parent / "plugins"),
}.items():
    os.environ[key] = value
# A COLUMNS in the environment (pytest-xdist's workers here started with COLUMNS=80) would make the
# CLI lay its tables out for a terminal, where the tests read what a pipe gets (raysim.cli.console).
os.environ.pop("COLUMNS", None)

import pytest  # noqa: E402

_TEMPLATE_STORE = os.path.join(_TMP, "template-mlflow.db")
_template_lock = threading.Lock()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Once MLflow's store code is loaded, new SQLite stores in this process copy a template."""
    utils = sys.modules.get("mlflow.store.db.utils")
    if utils is not None and not hasattr(utils._initialize_tables, "template"):
        utils._initialize_tables = tables_from_a_template(utils._initialize_tables)


def tables_from_a_template(initialize):
    """MLflow creates a store's tables by running its schema migrations, 2-3 s of CPU each time on
    2 cores: the first SQLite store of this process is created so and kept as the template, and
    each later one starts as a copy of it (the same file MLflow would write). Stores created in
    subprocesses (the CLI's drivers, the first-creation races) are MLflow's own."""

    def from_template(engine):
        path = engine.url.database
        if engine.url.get_backend_name() != "sqlite" or not path or path == ":memory:" or engine.url.query:
            return initialize(engine)
        with _template_lock:
            if _has_tables(path):  # MLflow's tables beside others': MLflow's own migrations
                return initialize(engine)
            if os.path.exists(_TEMPLATE_STORE):
                return _copy_store(_TEMPLATE_STORE, path)
            initialize(engine)
            _copy_store(path, _TEMPLATE_STORE)

    from_template.template = _TEMPLATE_STORE
    return from_template


def _has_tables(path: str) -> bool:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0


def _copy_store(source: str, target: str) -> None:
    """SQLite's online backup: a consistent copy even where another connection holds ``target``."""
    with contextlib.closing(sqlite3.connect(source)) as source_db:
        with contextlib.closing(sqlite3.connect(target)) as target_db:
            source_db.backup(target_db)


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
