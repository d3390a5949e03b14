"""`raysim submit` against a real head started with `ray start --head` on 127.0.0.1, with token
authentication on (a token in the head's ~/.ray/auth_token) and no auth variable anywhere.

The head runs in a temporary HOME holding the token; the submitting process shares that HOME, as
a user on the head's machine would. Teardown ends this head's processes only: `ray stop` would
end every Ray on the machine, the test session's own included.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

# Not marked slow: the README's cluster route is checked on every `make test` (about a minute: a head
# starting in 10-20 s and two short jobs on 2 busy cores).

REPO = Path(__file__).resolve().parents[3]
# Variables of the test session that would decide for the command what the test means to check.
UNSET = (
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "MLFLOW_TRACKING_URI",
    "RAYSIM_HOME",
)
TINY_JOB = {
    "name": "tiny",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 6}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "engine": {"num_rounds": 1, "cohort_size": 2},
    "resources": {"backend": "serial"},
    "tracking": {"experiment": "submit", "progress": False},
}
# Ports a head would otherwise take at fixed defaults (another head on the machine has them).
PINNED_PORTS = ("ray-client-server", "dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent",
                "metrics-export", "node-manager", "object-manager")  # fmt: skip
# Shrinks the documented quickstart to one round on one Ray worker.
QUICK = ["--variant", "fedavg", "engine.num_rounds=1", "engine.cohort_size=2", "algorithm.local.epochs=1",
         "resources.num_workers=1", "tracking.progress=false"]  # fmt: skip


@dataclass(frozen=True)
class Head:
    url: str
    env: dict[str, str]  # of the head, and of a user on its machine
    temp_dir: Path


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def stop_head(temp_dir: Path, gcs_port: int) -> None:
    """Ends the processes of the head whose session lives in ``temp_dir``, and their children."""
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}  # a command line naming temp_dir is not Ray
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        command = " ".join(proc.info["cmdline"] or []) + " "
        # every head process names its session folder, but the client server names the GCS only
        if proc.pid not in spared and (str(temp_dir) in command or f":{gcs_port} " in command):
            roots.append(proc)
    procs = list({p.pid: p for root in roots for p in [root, *_children(root)]}.values())
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.wait_procs(procs, timeout=2)[1]:  # the GCS takes long to end on SIGTERM
        proc.kill()


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def head():
    root = Path(tempfile.mkdtemp(prefix="rs-submit-", dir="/tmp"))  # short: Ray's socket paths
    (root / "home" / ".ray").mkdir(parents=True)
    (root / "home" / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    # the cluster's `python` is this environment's, and imports this checkout
    env |= {"HOME": str(root / "home"), "PYTHONPATH": str(REPO)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    gcs, dashboard, *others = free_ports(9)
    names = [f"--{name}-port" for name in PINNED_PORTS]
    command = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
        "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
        "--num-cpus", "2", "--temp-dir", str(root / "ray"), "--disable-usage-stats",
        *[str(item) for pair in zip(names, others) for item in pair],
    ]  # fmt: skip
    try:
        started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "Token authentication is enabled" in started.stderr + started.stdout
        yield Head(f"http://127.0.0.1:{dashboard}", env, root / "ray")
    finally:
        stop_head(root / "ray", gcs)
        shutil.rmtree(root, ignore_errors=True)


def raysim_submit(head: Head, cwd: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raysim", "submit", *args],
        cwd=cwd,
        env=head.env | env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def documented_submit(head: Head) -> list[str]:
    """The arguments of docs/cluster.md's first `raysim submit` command, aimed at ``head``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (REPO / "docs" / "cluster.md").read_text(), re.M | re.S)
    line = next(line for block in blocks for line in block.splitlines() if line.startswith("raysim submit"))
    args = shlex.split(line)[2:]
    args[args.index("--address") + 1] = head.url
    return args


def test_the_documented_submit_runs_the_job_and_lands_its_run_where_the_user_reads(head, tmp_path):
    """Relative --tracking-uri and --output-dir are the submitting directory's, not the job's
    working copy inside Ray's session folder."""
    (tmp_path / "jobs").mkdir()
    shutil.copy(REPO / "jobs" / "quickstart.yaml", tmp_path / "jobs")
    args = documented_submit(head) + ["--tracking-uri", "sqlite:///store/mlflow.db", "--output-dir", "out"]
    done = raysim_submit(head, tmp_path, args + QUICK)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    [job_id] = re.findall(r"submitted Ray job (raysubmit_\w+)", out)
    assert out.index(job_id) < out.index("Running entrypoint")  # the id first, then the logs
    assert f"job {job_id} SUCCEEDED" in out

    store = MlflowClient(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    [run] = store.search_runs([store.get_experiment_by_name("quickstart").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["ray.submission_id"] == job_id
    assert Path(run.data.tags["run_dir"]).is_relative_to(tmp_path / "out")
    assert list((tmp_path / "out").rglob("final.pt"))
    assert not list(head.temp_dir.rglob("mlflow.db"))  # nothing landed in the job's working copy


def test_a_failing_job_exits_non_zero_with_its_error(head, tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(TINY_JOB))
    # valid as config; the weights file is looked for only when the job builds its model
    done = raysim_submit(head, tmp_path, ["job.yaml", "--address", head.url, "model.init_from=missing.pt"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "model.init_from: no weights file" in done.stdout  # the job's own error, streamed
    assert re.search(r"job raysubmit_\w+ FAILED: Job entrypoint command failed with exit code 2", done.stdout)


def test_a_wrong_token_is_one_message_naming_where_the_token_goes(head, tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(TINY_JOB))
    done = raysim_submit(head, tmp_path, ["job.yaml", "--address", head.url], RAY_AUTH_TOKEN="not-the-token")
    assert done.returncode == 2
    assert "requires token authentication" in done.stderr and "~/.ray/auth_token" in done.stderr
    assert "RAY_AUTH_TOKEN" in done.stderr and "Traceback" not in done.stderr


def ctrl_c_delivered() -> None:
    """A terminal's Ctrl-C reaches the follower even when this suite runs as a background job of a
    non-interactive shell, whose children inherit SIGINT ignored (and Python keeps it so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_following_and_the_job_goes_on(head, tmp_path):
    from raysim.cli import ray_jobs

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(TINY_JOB))
    follower = subprocess.Popen(
        [sys.executable, "-m", "raysim", "submit", "job.yaml", "--address", head.url],
        cwd=tmp_path, env=head.env | {"PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_delivered,
    )  # fmt: skip
    first = follower.stdout.readline()
    [job_id] = re.findall(r"submitted Ray job (raysubmit_\w+)", first)
    follower.send_signal(signal.SIGINT)
    out = first + follower.communicate(timeout=60)[0]
    assert follower.returncode == 130, out
    assert "keeps running" in out and f"ray job stop {job_id} --address {head.url}" in out
    client = ray_jobs.connect(head.url, (Path(head.env["HOME"]) / ".ray" / "auth_token").read_text())
    assert ray_jobs.follow(client, job_id, io.StringIO())[0] == "SUCCEEDED"  # it ran to its end


def test_a_submitted_sweep_runs_its_chosen_cells_on_the_cluster_as_child_runs(head, tmp_path):
    sweep = TINY_JOB | {"sweep": {"seeds": [0, 1, 2]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(sweep))
    args = ["job.yaml", "--address", head.url, "--tracking-uri", "sqlite:///mlflow.db", "--only", "seed=0",
            "--only", "seed=2"]  # fmt: skip
    done = raysim_submit(head, tmp_path, args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tiny_seed0 FINISHED" in done.stdout and "tiny_seed2 FINISHED" in done.stdout
    store = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = store.search_runs([store.get_experiment_by_name("submit").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("raysim.kind") == "sweep"]
    cells = {r.data.tags["raysim.cell"]: r.info.status for r in runs if r is not parent}
    assert cells == {"tiny_seed0": "FINISHED", "tiny_seed2": "FINISHED"} and parent.info.status == "FINISHED"
