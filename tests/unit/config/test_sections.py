"""The job's own sections refuse values that would only fail deep inside a run, each in one line."""

import pytest
import yaml
from raw_jobs import BASE, problems_of

from raysim.config import JobConfig, apply_overrides


@pytest.mark.parametrize("uri", ["ftp://host/mlruns", "s3://bucket/mlruns", "sqllite:///mlflow.db"])
def test_a_tracking_uri_of_no_mlflow_store_is_refused_naming_the_key_and_the_schemes(uri):
    """ftp:// used to pass here and end the run in MLflow's KeyError: 'ftp'."""
    [problem] = problems_of({**BASE, "tracking": {"tracking_uri": uri}})
    scheme = uri.split(":")[0]
    assert problem.startswith(f"tracking.tracking_uri: MLflow has no store for the scheme {scheme!r}")
    assert "sqlite:///" in problem and "http(s)://" in problem


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "mlruns", "/abs/mlruns"])
def test_mlflows_file_store_is_refused_naming_a_database_or_a_server(uri):
    """MLflow 3 raises on its file store deep inside the run (issue 29, item 7)."""
    [problem] = problems_of({**BASE, "tracking": {"tracking_uri": uri}})
    assert problem.startswith(f"tracking.tracking_uri: {uri} is MLflow's file store")
    assert "sqlite:///path/mlflow.db or an MLflow server's http(s):// address" in problem


@pytest.mark.parametrize("uri", ["sqlite:/x.db", "sqlite://x.db", "sqlite:///"])
def test_a_malformed_sqlite_uri_is_refused_showing_the_right_form(uri):
    """SQLAlchemy's "Could not parse SQLAlchemy URL" traceback, deep in the run (issue 29, item 7)."""
    [problem] = problems_of({**BASE, "tracking": {"tracking_uri": uri}})
    assert problem.startswith(f"tracking.tracking_uri: {uri} is no SQLite URI: write sqlite:///")


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlflow.db",
        "sqlite:////abs/mlflow.db",
        "http://127.0.0.1:5000",
        "https://mlflow.example.org",
        "postgresql+psycopg2://u@h/db",
        "databricks",
        None,
    ],
)
def test_every_store_mlflow_has_is_accepted(uri):
    assert JobConfig.from_dict({**BASE, "tracking": {"tracking_uri": uri}}).tracking.tracking_uri == uri


@pytest.mark.parametrize("chunk", [0, "big", 2.5, True])
def test_a_chunk_size_is_a_number_of_clients_or_auto_in_one_line(chunk):
    [problem] = problems_of({**BASE, "engine": {"vectorize_chunk": chunk}})
    assert problem.startswith("engine.vectorize_chunk: must be a number of clients (1 or more) or auto")


@pytest.mark.parametrize("chunk", [1, 16, "auto"])
def test_a_number_of_clients_or_auto_is_a_chunk_size(chunk):
    assert JobConfig.from_dict({**BASE, "engine": {"vectorize_chunk": chunk}}).engine.vectorize_chunk == chunk


@pytest.mark.parametrize(("written", "mode"), [("on", "on"), ("off", "off"), ("auto", "auto")])
def test_vectorize_written_bare_in_yaml_or_an_override_is_its_mode(written, mode):
    """YAML reads a bare ``on``/``off`` as a boolean: ``engine.vectorize=on`` used to be refused
    as ``Input should be 'auto', 'on' or 'off' (got True)``."""
    raw = apply_overrides({**BASE}, [f"engine.vectorize={written}"])
    assert JobConfig.from_dict(raw).engine.vectorize == mode
    from_file = yaml.safe_load(f"engine: {{vectorize: {written}}}")
    assert JobConfig.from_dict({**BASE, **from_file}).engine.vectorize == mode


def test_vectorize_refuses_other_words_in_one_line():
    [problem] = problems_of({**BASE, "engine": {"vectorize": "yes please"}})
    assert problem.startswith("engine.vectorize: Input should be 'auto', 'on' or 'off'")


@pytest.mark.parametrize("gpus", ["big", 1.5, -0.25, True, None])
def test_a_gpu_share_is_auto_or_a_fraction_of_one_gpu_in_one_line(gpus):
    [problem] = problems_of({**BASE, "resources": {"gpus_per_worker": gpus}})
    assert problem == (
        "resources.gpus_per_worker: must be auto (measured) or a share of one GPU from 0 to 1 (a worker "
        f"uses one GPU; share one with fractions) (got {gpus!r})"
    )


@pytest.mark.parametrize(("gpus", "share"), [("auto", "auto"), (0, 0.0), (0.25, 0.25), (1, 1.0)])
def test_a_gpu_share_of_auto_or_a_fraction_is_taken(gpus, share):
    resources = JobConfig.from_dict({**BASE, "resources": {"gpus_per_worker": gpus}}).resources
    assert resources.gpus_per_worker == share


def test_auto_has_no_share_to_place_workers_with_until_it_is_measured():
    resources = JobConfig.from_dict({**BASE, "resources": {"gpus_per_worker": 0.5}}).resources
    assert resources.gpu_share == 0.5
    auto = JobConfig.from_dict({**BASE, "resources": {"gpus_per_worker": "auto"}}).resources
    with pytest.raises(ValueError, match="auto is measured before the workers start"):
        auto.gpu_share
