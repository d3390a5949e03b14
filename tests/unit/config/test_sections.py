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
    assert "sqlite://" in problem and "http://" in problem and "folder path" in problem


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlflow.db",
        "http://127.0.0.1:5000",
        "https://mlflow.example.org",
        "file:///tmp/mlruns",
        "mlruns",
        "/abs/mlruns",
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
