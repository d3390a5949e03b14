"""A tracking store that goes away mid-run costs the process's exit no wait: ``raysim run`` exits 3
within a bounded time of the outage, its records kept in the run folder, and its MLflow run left
RUNNING for ``raysim track upload``, never ended FINISHED by MLflow's exit hook.

Each run is a process of its own (tests/outage_driver.py): what happens at exit is the point.
Measured on a development machine with a real server: before the fix, the exit came 249 s after the
server was killed, and 1,186 s after it was stopped the driver still waited in MLflow's exit hook;
after it, 2 s and 33 s.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from raysim.cli.ui import LEAN_ENV, mlflow_command, stop_process_group, wait_until_ready
from raysim.tracking.outbox import UNSENT_EXIT_CODE, UNSENT_FILE
from raysim.tracking.store_calls import HTTP_DEFAULTS

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS))  # tests/mlflow_failures.py
from mlflow_failures import refused_uri  # noqa: E402

JOB = {
    "name": "tiny",
    "seed": 1,
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 8}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 32, "lr": 0.1}},
    "engine": {"num_rounds": 3, "cohort_size": 3},
    "evaluation": {"every": 1},
    "resources": {"backend": "serial"},
    "tracking": {"experiment": "exit", "progress": False},
}
# After the outage: the rest of a round, the end (checkpoint, plots) and the process's teardown,
# a few seconds; a dead server's calls fail at once, a hung one's after 2 x 10 s, then 10 s.
DEAD_BOUND_S, HUNG_BOUND_S = 30, 60


def run_driver(tmp_path: Path, failure: str, uri: str, pgid: int | None = None) -> tuple[int, float, str]:
    """The driver's exit code, the seconds from the outage to its exit, its stderr."""
    job = tmp_path / "tiny.yaml"
    job.write_text(yaml.safe_dump(JOB))
    stamp = tmp_path / "outage_at"
    args = [TESTS / "outage_driver.py", failure, job, tmp_path / "out", stamp, pgid or ""]
    command = [sys.executable, *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent), "MLFLOW_TRACKING_URI": uri}
    for key in HTTP_DEFAULTS:  # a user who set none of them
        env.pop(key, None)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver did not exit within 300 s of its start ({failure})")
    exited = time.time()
    return done.returncode, exited - float(stamp.read_text()), done.stderr


def run_folder(tmp_path: Path) -> Path:
    [folder] = (tmp_path / "out" / "runs").iterdir()
    return folder


def status_of(uri: str) -> str:
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("exit").experiment_id])
    return run.info.status


def test_a_run_whose_final_pt_a_full_disk_refused_stays_running_after_exit(tmp_path):
    """MLflow's exit hook ended it FINISHED, its ``final.pt`` never sent."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    code, _, err = run_driver(tmp_path, "artifacts-full", uri)
    assert code == UNSENT_EXIT_CODE, err
    folder = run_folder(tmp_path)
    assert (folder / "checkpoints" / "final.pt").is_file() and (folder / UNSENT_FILE).is_file()
    assert status_of(uri) == "RUNNING"


def test_a_store_gone_mid_run_costs_the_exit_no_wait(tmp_path):
    """The run's end waits, as a call to a dead server does with MLflow's default retries (256 s),
    if anything asks the store to end it: MLflow's exit hook did."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    code, after_s, err = run_driver(tmp_path, "server-gone", uri)
    assert code == UNSENT_EXIT_CODE, err
    assert after_s < DEAD_BOUND_S
    assert (run_folder(tmp_path) / UNSENT_FILE).is_file()
    assert "Traceback" not in err and status_of(uri) == "RUNNING"


@pytest.fixture
def mlflow_server(tmp_path):
    """A real MLflow server in a process group of its own (to kill or stop as a whole): (URI, pgid)."""
    store = tmp_path / "store"
    store.mkdir()
    port = int(refused_uri().rsplit(":", 1)[1])
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            mlflow_command(f"sqlite:///{store / 'mlflow.db'}", "127.0.0.1", port, 1),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**LEAN_ENV, **os.environ},
            cwd=store,
            start_new_session=True,
        )
    try:
        wait_until_ready(server, f"http://127.0.0.1:{port}", log)
        yield f"http://127.0.0.1:{port}", server.pid
    finally:
        os.killpg(server.pid, signal.SIGCONT)  # a stopped server takes no SIGTERM
        stop_process_group(server)


@pytest.mark.slow  # a real MLflow server: 10-20 s to start on two busy cores
@pytest.mark.parametrize(("failure", "bound_s"), [("kill", DEAD_BOUND_S), ("stop", HUNG_BOUND_S)])
def test_a_real_tracking_server_killed_or_hung_mid_run(failure, bound_s, tmp_path, mlflow_server):
    uri, pgid = mlflow_server
    code, after_s, err = run_driver(tmp_path, failure, uri, pgid)
    assert code == UNSENT_EXIT_CODE, err
    assert after_s < bound_s, f"exit {after_s:.0f} s after the server's {failure}"
    folder = run_folder(tmp_path)
    assert (folder / "checkpoints" / "final.pt").is_file() and (folder / UNSENT_FILE).is_file()
    assert "Traceback" not in err
    if failure == "stop":  # it goes on with what waited for it: never the exit hook's end of the run
        os.killpg(pgid, signal.SIGCONT)
        assert status_of(uri) == "RUNNING"
