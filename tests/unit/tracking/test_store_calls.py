"""raysim's calls to MLflow: bounded in time where the user set nothing, and MLflow's exit hook
kept from deciding a run's status."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES as MAX_RETRIES
from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_TIMEOUT as REQUEST_TIMEOUT
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raysim.tracking import store_calls
from raysim.tracking.outbox import outage_reason
from raysim.tracking.store_calls import HTTP_DEFAULTS, RETRIES, TIMEOUT, bound_store_calls, call_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/mlflow_failures.py
from mlflow_failures import hung_uri  # noqa: E402


@pytest.fixture
def unset(monkeypatch):
    """None of MLflow's HTTP settings made, by the user or by raysim."""
    for key in HTTP_DEFAULTS:
        monkeypatch.setenv(key, "")  # so that teardown restores the key as it was, set or not
        monkeypatch.delenv(key)
    monkeypatch.setattr(store_calls, "_SET_BY_RAYSIM", set())


def test_raysim_bounds_mlflows_http_calls_where_the_user_set_nothing(unset, monkeypatch):
    monkeypatch.setenv(TIMEOUT, "30")
    assert (MAX_RETRIES.get(), REQUEST_TIMEOUT.get()) == (7, 30)  # MLflow's 7 retries spend minutes
    bound_store_calls()
    assert (MAX_RETRIES.get(), REQUEST_TIMEOUT.get()) == (1, 30)  # the user's timeout stays
    with call_settings(**{RETRIES: "0", TIMEOUT: "99"}):
        assert (MAX_RETRIES.get(), REQUEST_TIMEOUT.get()) == (0, 30)
    assert (MAX_RETRIES.get(), REQUEST_TIMEOUT.get()) == (1, 30)


def test_a_call_to_a_hung_server_gives_up_within_its_bound(unset, monkeypatch):
    """(1 + retries) x timeout + backoff: 2 x 10 s + at most 1 s with raysim's defaults, 2 x 1 s here
    (MLflow's own: 8 x 120 s and minutes of backoff)."""
    monkeypatch.setitem(HTTP_DEFAULTS, TIMEOUT, "1")
    bound_store_calls()
    with hung_uri() as uri:
        start = time.monotonic()
        with pytest.raises(MlflowException) as info:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        assert time.monotonic() - start < 2 * 1 + 1 + 1.5  # the bound, and a margin for a busy machine
    assert outage_reason(info.value) == "no answer in time"


def test_mlflows_exit_hook_no_longer_ends_a_run_raysim_left_running(tmp_path):
    """MLflow's hook ended it FINISHED at exit; a run raysim could not end stays RUNNING for `raysim
    track upload`, one whose driver died is ended KILLED by its sentinel."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = textwrap.dedent(f"""
        import mlflow
        from raysim.tracking.store_calls import unhook_mlflow_exit
        mlflow.set_tracking_uri({uri!r})
        print(mlflow.start_run().info.run_id)
        unhook_mlflow_exit()
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[-1]
    assert MlflowClient(uri).get_run(run_id).info.status == "RUNNING"


def test_a_run_left_running_is_no_longer_active_for_the_next_start(tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    left = mlflow.start_run().info.run_id
    try:
        store_calls.forget_active_run(left)
        assert mlflow.active_run() is None
        assert MlflowClient().get_run(left).info.status == "RUNNING"  # the store was told nothing
        mlflow.start_run()  # raised: "Run with UUID ... is already active"
        mlflow.end_run()
    finally:
        store_calls.forget_active_run(left)
