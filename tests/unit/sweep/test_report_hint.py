"""The ``raysim report`` command a finished sweep prints: its id, a metric its cells logged, its
first axis as the columns, the others to choose on validation data, and a store not the default."""

import yaml

from raysim.config.cells import load_sweep
from raysim.sweep.cell_ledger import CellOutcome
from raysim.sweep.report_hint import report_command

JOB = {
    "name": "hinted",
    "dataset": {"name": "digits", "partition": {"kind": "dirichlet", "num_clients": 10, "alpha": 0.5}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
    "sweep": {"seeds": [0, 1], "grid": {"dataset.partition.alpha": [0.1, 1.0]}},
}


def sweep_of(tmp_path, **sweep):
    path = tmp_path / "hinted.yaml"
    path.write_text(yaml.safe_dump({**JOB, "sweep": {**JOB["sweep"], **sweep}}))
    return load_sweep(path)


def outcome(*metrics):
    return CellOutcome("c", "FINISHED", final={key: 0.5 for key in metrics})


def test_one_axis_is_the_columns_and_the_central_accuracy_is_preferred(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///default.db")
    sweep = sweep_of(tmp_path)
    done = [outcome("train/loss", "eval/clients/accuracy"), outcome("eval/central/accuracy")]
    assert report_command(sweep, done, "sqlite:///default.db") == (
        f"raysim report {sweep.id} --metric eval/central/accuracy --columns dataset.partition.alpha"
    )
    assert report_command(sweep, [outcome("eval/clients/perplexity")], "sqlite:////tmp/other.db") == (
        f"raysim report {sweep.id} --metric eval/clients/perplexity --columns dataset.partition.alpha "
        "--tracking-uri sqlite:////tmp/other.db"  # not the store report reads by default
    )


def test_more_axes_are_chosen_on_validation_and_a_stopping_metric_is_the_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///default.db")
    sweep = sweep_of(
        tmp_path,
        grid={"dataset.partition.alpha": [0.1, 1.0], "algorithm.local.lr": [0.01, 0.1]},
        stopping={"metric": "eval/clients/accuracy", "mode": "max"},
    )
    assert report_command(sweep, [outcome("eval/central/accuracy")], "sqlite:///default.db") == (
        f"raysim report {sweep.id} --metric eval/clients/accuracy --columns algorithm.local.lr "
        "--select dataset.partition.alpha --on VALIDATION_METRIC"
    )  # the axes in the file's order (yaml.safe_dump sorted them)
