"""`raysim ui` with a real MLflow server: it stops with raysim (by signal, or when raysim is killed),
and the links `raysim run` prints open the training views in a real headless browser."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
import yaml

from raysim.cli.main import main

TESTS = Path(__file__).resolve().parents[2]
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # tests/ui_screenshots.py, a script that is also run by hand
import ui_screenshots as screenshots  # noqa: E402


def group_members(pgid):
    """Processes of the group that are not zombies (dead, not yet reaped by init)."""
    table = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True).stdout
    return [
        int(p) for p, g, s in (row.split() for row in table.splitlines()) if int(g) == pgid and s[0] != "Z"
    ]


def port_open(port):
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def start_ui(tracking_uri, port):
    """`raysim ui` as a user starts it; returns it and its server's process group once it answers."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=tracking_uri).search_experiments()  # creates the store
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "raysim.cli.main",
        "ui",
        "--port",
        str(port),
        "--tracking-uri",
        tracking_uri,
    ]
    raysim = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert raysim.stdout is not None
    lines = []
    for line in raysim.stdout:
        lines.append(line)
        if "answered after" in line:
            break
    else:
        pytest.fail(f"raysim ui exited with {raysim.wait()}:\n{''.join(lines)}")
    children = Path(f"/proc/{raysim.pid}/task/{raysim.pid}/children").read_text().split()
    assert len(children) == 1 and port_open(port)
    server_group = os.getpgid(int(children[0]))
    assert server_group != os.getpgid(raysim.pid)  # its own group: Ctrl-C in a terminal reaches raysim only
    return raysim, server_group


@pytest.mark.parametrize(
    ("sig", "port"),
    [
        (signal.SIGTERM, 18640),
        # ~15 s each on 2 busy cores. SIGKILL: raysim cleans nothing up, the kernel tells the server
        # (PR_SET_PDEATHSIG); SIGINT (Ctrl-C) and SIGHUP take the clean-up path SIGTERM takes.
        pytest.param(signal.SIGKILL, 18641, marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, 18642, marks=pytest.mark.slow),
        pytest.param(signal.SIGHUP, 18643, marks=pytest.mark.slow),
    ],
)
def test_stopping_raysim_ui_stops_its_mlflow_server(sig, port, tracking_uri):
    raysim, server_group = start_ui(tracking_uri, port)
    assert group_members(server_group)
    stopped = time.monotonic()
    raysim.send_signal(sig)
    deadline = stopped + 10
    while time.monotonic() < deadline and (port_open(port) or group_members(server_group)):
        time.sleep(0.2)
    left = group_members(server_group)
    if left:  # do not leave a server behind for the next tests
        os.killpg(server_group, signal.SIGKILL)
    assert not left, f"MLflow processes {left} outlived raysim ui by 10 s"
    assert not port_open(port)
    assert raysim.wait(timeout=10) == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
    print(f"{sig.name}: server gone after {time.monotonic() - stopped:.1f} s")


def test_run_prints_links_to_each_run_the_chart_view_and_the_compare_view(tmp_path, tracking_uri, capsys):
    from mlflow.tracking import MlflowClient

    job = tmp_path / "job.yaml"
    raw = {
        **screenshots.JOB,
        "variants": screenshots.JOB["variants"][:2],
        "engine": {"num_rounds": 1, "cohort_size": 3},
    }
    job.write_text(yaml.safe_dump(raw))
    assert main(["run", str(job), "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "raysim ui" in out  # a SQLite store is seen through raysim ui
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("ui-check").experiment_id
    runs = {r.info.run_name: r.info.run_id for r in client.search_runs([experiment])}
    base = "http://127.0.0.1:5000/#/experiments"
    for name in ("ui/avg", "ui/prox"):  # labelled with the MLflow run names, job/variant
        assert re.search(rf"run {name}\s+{base}/{experiment}/runs/{runs[name]}\n", out)
    assert re.search(rf"charts\s+{re.escape(f'{base}/{experiment}/runs?compareRunsMode=CHART')}\n", out)
    compare = next(word for word in out.split() if "compare-runs" in word)
    query = parse_qs(urlsplit(urlsplit(compare).fragment).query)
    assert sorted(json.loads(query["runs"][0])) == sorted(runs.values())
    assert json.loads(query["experiments"][0]) == [experiment]


def is_png_with_content(path):
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (900, 1400)
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]).round(2), axis=0)
    return len(colours) > 50  # text, lines and widgets, not a blank or single-colour page


@pytest.mark.skipif(
    screenshots.chromium() is None, reason="needs chromium (Debian: apt-get install chromium)"
)
def test_the_printed_links_show_the_runs_in_a_real_browser(tmp_path):
    pages = screenshots.take_screenshots(tmp_path, port=18644)  # ~25-40 s on 2 busy cores
    for view, heading in (("charts", "Training runs"), ("compare", "Comparing 3 Runs")):
        page = pages[view]
        assert is_png_with_content(page.png), view
        assert heading in page.dom, f"{view}: not the training view (MLflow's GenAI page?)"
        for name in screenshots.RUN_NAMES:
            assert f">{name}<" in page.dom, f"{view} does not name run {name}"
        assert screenshots.METRIC in page.dom, f"{view} does not show {screenshots.METRIC}"


def test_raysim_server_takes_runs_and_their_artifacts_over_http(tmp_path):
    """A driver on another machine logs through the server alone: runs into its store, artifacts
    uploaded into its artifact destination (no shared filesystem needed)."""
    from mlflow.tracking import MlflowClient

    from jobs import tiny_job
    from raysim.engine.loop import run

    port, artifacts = 18645, tmp_path / "artifacts"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "-m", "raysim.cli.main", "server", "--port", str(port),
               "--backend-store-uri", store, "--artifacts-destination", str(artifacts)]  # fmt: skip
    server = subprocess.Popen(
        command, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        printed = "".join(line for _, line in zip(range(2), server.stdout))  # the address, then the URI
        uri = f"http://127.0.0.1:{port}"
        assert f"export MLFLOW_TRACKING_URI={uri}" in printed, printed
        job = tiny_job(
            engine={"num_rounds": 1}, tracking={"enabled": True, "tracking_uri": uri, "experiment": "remote"}
        )
        result = run(job, output_dir=tmp_path / "out")
        client = MlflowClient(uri)
        assert client.get_run(result.run_id).info.status == "FINISHED"
        uploaded = list(artifacts.rglob("job.yaml"))
        assert len(uploaded) == 1 and result.run_id in str(uploaded[0])
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=15) == 0
    assert not port_open(port)
