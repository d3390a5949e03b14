"""Direct links into the MLflow UI: a run, an experiment's runs as charts, a comparison of runs.

MLflow 3 opens an experiment on its GenAI overview, empty for training runs; these links land on
the training views instead. The UI routes sit after ``#`` (a hash router), e.g.
``http://127.0.0.1:5000/#/experiments/1/runs?compareRunsMode=CHART``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from raysim.tracking.tracking_store import is_server, sqlite_path

DEFAULT_UI = "http://127.0.0.1:5000"  # where `raysim ui` serves a local store by default


def ui_base(tracking_uri: str, default: str = DEFAULT_UI) -> str:
    """The UI's address: the tracking server itself for an http(s) URI, else where ``raysim ui``
    last served this local store (``remember_ui``; ``raysim ui --port 5001`` serves it on 5001),
    else ``default``."""
    if is_server(tracking_uri):
        return tracking_uri.rstrip("/")
    record = _record(tracking_uri)
    remembered = record.read_text().strip() if record is not None and record.is_file() else ""
    return (remembered or default).rstrip("/")


def remember_ui(tracking_uri: str, url: str) -> None:
    """Notes where ``raysim ui`` serves a SQLite store, so that the links later runs print point
    there; a store it cannot write beside is left unnoted (the links say the default port)."""
    record = _record(tracking_uri)
    if record is not None:
        try:
            record.write_text(url + "\n")
        except OSError:
            pass


def _record(tracking_uri: str) -> Path | None:
    """``mlflow.db.ui`` beside a store ``mlflow.db``: one line, the UI's address."""
    database = sqlite_path(tracking_uri)
    return database.with_name(database.name + ".ui") if database is not None else None


def run_link(base: str, experiment_id: str, run_id: str) -> str:
    """The run's page: metrics, params, artifacts."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def chart_link(base: str, experiment_id: str) -> str:
    """The experiment's runs, each metric as one chart with a line per run."""
    return f"{base}/#/experiments/{experiment_id}/runs?compareRunsMode=CHART"


def compare_link(base: str, run_ids: Iterable[str], experiment_ids: Iterable[str]) -> str:
    """MLflow's compare view of the runs: their params and metrics side by side.

    The JSON lists are percent-encoded so that terminals see the whole link as one URL (a
    terminal ends a link at ``"``); the UI decodes them.
    """
    runs = quote(json.dumps(list(run_ids), separators=(",", ":")), safe="")
    experiments = quote(json.dumps(sorted(set(experiment_ids)), separators=(",", ":")), safe="")
    return f"{base}/#/compare-runs?runs={runs}&experiments={experiments}"
