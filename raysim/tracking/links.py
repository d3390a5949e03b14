"""Direct links into the MLflow UI: a run, an experiment's runs as charts, a comparison of runs.

MLflow 3 opens an experiment on its GenAI overview, empty for training runs; these links land on
the training views instead. The UI routes sit after ``#`` (a hash router), e.g.
``http://127.0.0.1:5000/#/experiments/1/runs?compareRunsMode=CHART``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import quote

from raysim.tracking.tracking_store import is_server

DEFAULT_UI = "http://127.0.0.1:5000"  # where `raysim ui` serves a local store by default


def ui_base(tracking_uri: str, default: str = DEFAULT_UI) -> str:
    """The UI's address: the tracking server itself for an http(s) URI, else where ``raysim ui``
    serves a local store (``default``)."""
    if is_server(tracking_uri):
        return tracking_uri.rstrip("/")
    return default.rstrip("/")


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
