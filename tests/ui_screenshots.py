"""Checks the MLflow views ``raysim run`` links to in a real headless browser, with screenshots.

Makes a fresh store with three tiny real runs (``raysim run``), starts ``raysim ui`` on it, and
opens the links ``raysim run`` printed for the experiment's runs as charts and for the compare
view of the runs in headless Chromium: a screenshot of each (PNG) and its rendered DOM (HTML).

By hand (needs the Debian package ``chromium``)::

    PYTHONPATH=$PWD python tests/ui_screenshots.py OUT_DIR [--port 18650]

tests/integration/tracking/test_mlflow_ui.py runs it and checks what it returns.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_NAMES = ("ui/avg", "ui/prox", "ui/adam")  # MLflow run names: job/variant
VIEWS = ("charts", "compare")  # the runs as charts, and MLflow's compare view
METRIC = "eval/clients/accuracy"  # digits has no central test set
JOB = {
    "name": "ui",
    "seed": 3,
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 32, "lr": 0.1}},
    "engine": {"num_rounds": 3, "cohort_size": 3},
    "evaluation": {"every": 1},
    "resources": {"backend": "serial"},
    "tracking": {"experiment": "ui-check", "progress": False},
    "variants": [
        {"name": "avg"},
        {"name": "prox", "algorithm": {"name": "fedprox"}},
        {"name": "adam", "algorithm": {"name": "fedadam"}},
    ],
}


@dataclass
class Page:
    """One view: its link, the screenshot and the rendered DOM (also saved beside it as .html)."""

    url: str
    png: Path
    dom: str


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def make_runs(workdir: Path, env: dict[str, str]) -> dict[str, str]:
    """Runs the three-variant job with ``raysim run``; returns the links it printed, by label."""
    job = workdir / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    done = subprocess.run(
        [sys.executable, "-m", "raysim.cli.main", "run", str(job), "--output-dir", str(workdir / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"raysim run failed:\n{done.stdout}\n{done.stderr}")
    return dict(re.findall(r"^\s+(run \S+|charts|compare)\s+(http\S+)$", done.stdout, re.MULTILINE))


def start_ui(port: int, env: dict[str, str]) -> subprocess.Popen:
    """``raysim ui`` on the store; returns once it printed its address (it does so once it answers,
    and gives up by itself when the server does not start)."""
    ui = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli.main", "ui", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert ui.stdout is not None
    for line in ui.stdout:  # the server's own log goes to a file: these are raysim's lines
        if "answered after" in line:
            print(line, end="")
            return ui
    raise RuntimeError(f"raysim ui exited with code {ui.wait()} before answering")


def capture(browser: str, url: str, png: Path, expect: list[str], attempts: int = 3) -> Page:
    """Screenshot and rendered DOM of one page, once the DOM shows every ``expect`` text.

    Headless Chromium snapshots the page when its virtual-time budget runs out; MLflow draws its
    charts after fetching each metric's history, which sometimes takes longer than the budget
    allows on busy cores: a page without the charts yet is taken again with twice the budget.
    """
    for attempt in range(attempts):
        page = _snapshot(browser, url, png, budget_ms=20000 * 2**attempt)
        if all(text in page.dom for text in expect):
            break
    return page


def _snapshot(browser: str, url: str, png: Path, budget_ms: int) -> Page:
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--virtual-time-budget={budget_ms}", "--window-size=1400,900", f"--screenshot={png}",
         "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    if done.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed on {url}:\n{done.stderr[-2000:]}")
    png.with_suffix(".html").write_text(done.stdout)
    return Page(url, png, done.stdout)


def take_screenshots(out_dir: Path, port: int = 18650) -> dict[str, Page]:
    """The runs chart view and the compare view of three fresh runs, as ``{"charts", "compare"}``."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (Debian: apt-get install chromium)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="raysim-ui-") as tmp:
        workdir = Path(tmp)
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        links = make_runs(workdir, env)
        missing = {"charts", "compare", *(f"run {name}" for name in RUN_NAMES)} - set(links)
        if missing:
            raise RuntimeError(f"raysim run printed no link for {sorted(missing)}: {links}")
        # the links point at raysim ui's default port; this one serves the same store on `port`
        links = {k: v.replace("http://127.0.0.1:5000", f"http://127.0.0.1:{port}") for k, v in links.items()}
        ui = start_ui(port, env)
        try:
            expect = [METRIC, *(f">{name}<" for name in RUN_NAMES)]  # run names as the pages write them
            return {view: capture(browser, links[view], out_dir / f"{view}.png", expect) for view in VIEWS}
        finally:
            ui.send_signal(signal.SIGTERM)
            ui.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--port", type=int, default=18650)
    args = parser.parse_args()
    for view, page in take_screenshots(args.out_dir, args.port).items():
        named = [name for name in RUN_NAMES if f">{name}<" in page.dom]
        shown = METRIC in page.dom
        print(f"{view}: {page.png} ({page.url}); runs named in the page: {named}; {METRIC} shown: {shown}")


if __name__ == "__main__":
    main()
