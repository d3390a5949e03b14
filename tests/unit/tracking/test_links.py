"""Direct links into the MLflow UI: the routes MLflow 3's hash router serves (checked in a real
browser by tests/ui_screenshots.py)."""

import json
from urllib.parse import parse_qs, urlsplit

from raysim.tracking.links import DEFAULT_UI, chart_link, compare_link, run_link, ui_base


def test_the_base_is_the_tracking_server_else_raysim_ui():
    assert ui_base("http://10.0.0.5:5000/") == "http://10.0.0.5:5000"
    assert ui_base("https://mlflow.example.org") == "https://mlflow.example.org"
    assert ui_base("sqlite:////tmp/mlflow.db") == DEFAULT_UI == "http://127.0.0.1:5000"
    assert ui_base("sqlite:////tmp/mlflow.db", default="http://127.0.0.1:18600/") == "http://127.0.0.1:18600"


def test_run_and_chart_links_land_on_the_training_views():
    assert run_link("http://h:5000", "7", "abc") == "http://h:5000/#/experiments/7/runs/abc"
    assert chart_link("http://h:5000", "7") == "http://h:5000/#/experiments/7/runs?compareRunsMode=CHART"


def test_compare_link_holds_the_runs_and_each_experiment_once_as_json():
    link = compare_link("http://h:5000", ["r1", "r2", "r3"], ["2", "1", "2"])
    assert link.startswith("http://h:5000/#/compare-runs?runs=")
    assert not set('"[] ,') & set(link)  # a terminal sees one whole URL
    query = parse_qs(urlsplit(urlsplit(link).fragment).query)
    assert json.loads(query["runs"][0]) == ["r1", "r2", "r3"]
    assert json.loads(query["experiments"][0]) == ["1", "2"]
