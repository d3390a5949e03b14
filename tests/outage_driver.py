"""``raysim run JOB --output-dir OUT`` in a process of its own whose tracking store fails once round
``BREAK_ROUND`` is logged, for tests that watch the process end (exit code, time, the MLflow run's
status once the process is gone): tests/integration/tracking/test_tracking_exit.py.

    python tests/outage_driver.py FAILURE JOB OUT STAMP [PGID]

FAILURE is one of:
    artifacts-full  the local artifact store is full from then on (metrics and the run's end still go)
    server-gone     MLflow's client raises "connection refused" from then on, except the run's end,
                    which waits as a call to a dead server does with MLflow's default retries
    kill            SIGKILL to the process group PGID (a real MLflow server)
    stop            SIGSTOP to the process group PGID: a hung server, accepting and never answering

The time of the failure (``time.time()``) is written to STAMP.
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/mlflow_failures.py

from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow_failures import artifacts_full, server_gone  # noqa: E402

from raysim.cli.main import main  # noqa: E402
from raysim.engine.engine import Engine  # noqa: E402

BREAK_ROUND = 1
DEFAULT_RETRIES_S = 600  # longer than any test waits: MLflow's 7 retries to a dead server took 256 s


def failing(method, failure, broken):
    def call(self, *args, **kwargs):
        if broken:
            raise failure
        return method(self, *args, **kwargs)

    return call


def waiting(method, broken):
    def call(self, *args, **kwargs):
        if broken:
            time.sleep(DEFAULT_RETRIES_S)
        return method(self, *args, **kwargs)

    return call


def main_with(failure: str, job: str, out: str, stamp: str, pgid: str = "") -> int:
    broken: list[bool] = []  # non-empty once the store is gone
    if failure == "artifacts-full":
        LocalArtifactRepository.log_artifact = failing(
            LocalArtifactRepository.log_artifact, artifacts_full(), broken
        )
    elif failure == "server-gone":
        MlflowClient.log_batch = failing(MlflowClient.log_batch, server_gone(), broken)
        MlflowClient.set_terminated = waiting(MlflowClient.set_terminated, broken)
    log = Engine.log

    def log_then_break(self, metrics, logged_round):
        log(self, metrics, logged_round)
        if logged_round == BREAK_ROUND and not broken:
            if failure in ("kill", "stop"):
                os.killpg(int(pgid), signal.SIGKILL if failure == "kill" else signal.SIGSTOP)
            broken.append(True)
            Path(stamp).write_text(repr(time.time()))

    Engine.log = log_then_break
    return main(["run", job, "--output-dir", out])


if __name__ == "__main__":
    sys.exit(main_with(*sys.argv[1:]))
