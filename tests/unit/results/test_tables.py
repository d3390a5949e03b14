"""``raysim.results.tables``: the columns each task gets, derived perplexities, the curves' bands.

Expected values are written by hand (exp of round losses, the metric dicts below), never taken
from the code under test.
"""

import csv
import math
from types import SimpleNamespace

import pytest
from rich.console import Console

from raysim.engine.plots import overlaid_curves
from raysim.results.tables import (
    RunRecord,
    comparison_table,
    curve_panels,
    metric_value,
    task_of,
    task_tables,
    write_csv,
)

CLASSIFIER = {
    "eval/central/accuracy": 0.91,
    "eval/clients/accuracy": 0.88,
    "eval/clients/accuracy_std": 0.05,
    "eval/clients/accuracy_p10": 0.8,
    "eval/clients/accuracy_p90": 0.95,
    "eval/clients/loss": 0.4,
    "eval/heldout/accuracy": 0.85,
    "eval/heldout/personalized_50/accuracy": 0.9,
    "train/loss": 0.3,
}
LANGUAGE_MODEL = {
    "eval/clients/loss": 3.0,
    "eval/clients/loss_std": 0.2,
    "eval/clients/loss_p10": math.log(15.0),
    "eval/clients/loss_p90": math.log(30.0),
    "eval/clients/perplexity": 20.0,
    "eval/clients/accuracy": 0.3,
    "eval/clients/accuracy_std": 0.02,
    "eval/heldout/loss": 3.1,
    "eval/heldout/perplexity": 22.0,
    "eval/heldout/personalized_25/loss": math.log(12.0),
    "eval/heldout/personalized_50/loss": 2.0,
    "eval/transfer/so/loss": 4.0,
    "eval/transfer/so/perplexity": 54.6,
    "train/loss": 2.5,
}
REGRESSOR = {"eval/central/loss": 0.6, "eval/central/pearson": 0.8, "train/loss": 0.5}


def record(final, name="run", history=None, seconds=12.0):
    return RunRecord(name, "fedavg", final, history or [(0, {}), (1, {})], seconds, run_id=name + "-id")


def table_of(final):
    [table] = task_tables([record(final)])
    return table


def test_the_task_is_read_from_the_metric_names():
    assert task_of(LANGUAGE_MODEL) == "causal_lm"  # it logs an accuracy too
    assert task_of(CLASSIFIER) == "classification"
    assert task_of(REGRESSOR) == "regression"


def test_a_classifier_shows_accuracies_and_its_spread_over_clients():
    table = table_of(CLASSIFIER)
    headers = [h.replace("\n", " ") for h in table.headers]
    assert headers == [
        "run", "algorithm", "central acc", "client acc", "± std", "p10-p90", "held-out acc",
        "pers. 50% acc", "train loss", "rounds", "time s",
    ]  # fmt: skip
    assert table.rows() == [
        [
            "run",
            "fedavg",
            "0.9100",
            "0.8800",
            "0.0500",
            "0.8000-0.9500",
            "0.8500",
            "0.9000",
            "0.3000",
            "2",
            "12.0",
        ]
    ]


def test_a_language_model_shows_perplexities_personalized_and_transfer():
    table = table_of(LANGUAGE_MODEL)
    headers = [h.replace("\n", " ") for h in table.headers]
    assert headers == [
        "run", "algorithm", "client ppl", "p10-p90", "held-out ppl", "pers. 25% ppl", "pers. 50% ppl",
        "so ppl", "train loss", "rounds", "time s",
    ]  # fmt: skip
    # p10-p90 and the personalized perplexities are exp of the logged losses: 15, 30, 12, e^2
    assert table.rows()[0][2:8] == ["20.00", "15.00-30.00", "22.00", "12.00", "7.3891", "54.60"]


def test_a_regressor_shows_losses_and_its_score():
    headers = [h.replace("\n", " ") for h in table_of(REGRESSOR).headers]
    assert headers == [
        "run",
        "algorithm",
        "central loss",
        "central pearson",
        "train loss",
        "rounds",
        "time s",
    ]


def test_a_perplexity_not_logged_is_exp_of_its_loss_and_a_logged_one_wins():
    metrics = {
        "eval/heldout/personalized_25/loss": 2.0,
        "eval/clients/loss_p90": 1.5,
        "a/perplexity": 9.0,
        "a/loss": 1.0,
    }
    assert (
        metric_value(metrics, "eval/heldout/personalized_25/perplexity") == math.exp(2.0) == 7.38905609893065
    )
    assert metric_value(metrics, "eval/clients/perplexity_p90") == 4.4816890703380645  # e^1.5
    assert metric_value(metrics, "a/perplexity") == 9.0
    assert metric_value(metrics, "eval/clients/perplexity_std") is None  # exp of a std means nothing
    assert metric_value(metrics, "eval/central/accuracy") is None


def test_runs_of_two_tasks_get_a_table_each():
    tables = task_tables([record(CLASSIFIER, "a"), record(LANGUAGE_MODEL, "b"), record(CLASSIFIER, "c")])
    assert [(t.task, [r.name for r in t.records]) for t in tables] == [
        ("classification", ["a", "c"]),
        ("causal_lm", ["b"]),
    ]


def test_run_summary_fits_the_task(tmp_path):
    """``raysim run``'s table from RunResult-like objects: a LM run shows perplexities."""

    def result(name, final):
        job = SimpleNamespace(name=name, algorithm=SimpleNamespace(name="fedfish"))
        history = [(0, {"sys/clients_per_s": 10.0}), (1, {"sys/clients_per_s": 20.0})]
        return SimpleNamespace(job=job, final=final, history=history, seconds=3.0, run_id=None)

    console = Console(width=200, record=True)
    console.print(comparison_table([result("lm", LANGUAGE_MODEL)]))
    text = console.export_text()
    assert "ppl" in text and "pers. 25%" in text and "acc" not in text
    [cells] = [line.split() for line in text.splitlines() if line.split()[:1] == ["lm"]]
    assert cells[1] == "fedfish"  # a run not named after its algorithm keeps the algorithm column
    assert cells[2:4] == ["20.00", "15.00-30.00"]  # client perplexity and its p10-p90
    assert cells[-3:] == ["2", "3.0", "15.0"]  # rounds, seconds, clients/s: the mean of 10 and 20


def test_csv_has_one_column_per_metric_key(tmp_path):
    path = write_csv([record(LANGUAGE_MODEL, "lm")], tmp_path / "t.csv")
    [row] = list(csv.DictReader(path.open()))
    assert row["run"] == "lm" and row["run_id"] == "lm-id" and row["task"] == "causal_lm"
    assert float(row["eval/heldout/personalized_25/perplexity"]) == pytest.approx(
        12.0, rel=1e-12
    )  # exp(log 12)
    assert float(row["eval/clients/perplexity_p90"]) == pytest.approx(30.0, rel=1e-12)
    assert row["rounds"] == "2.0" and row["time_s"] == "12.0"


def history(base_loss):
    """Three rounds of a LM's client losses, p10/p90 at -/+ 0.5, a central loss, no spread."""
    return [
        (r, {
            "eval/clients/loss": base_loss - r,
            "eval/clients/loss_p10": base_loss - r - 0.5,
            "eval/clients/loss_p90": base_loss - r + 0.5,
            "eval/clients/perplexity": math.exp(base_loss - r),
            "eval/central/loss": base_loss - r,
            "eval/central/perplexity": math.exp(base_loss - r),
        })
        for r in range(3)
    ]  # fmt: skip


def test_curves_are_shaded_between_p10_and_p90_where_logged(tmp_path):
    runs = [record(LANGUAGE_MODEL, "a", history(4.0)), record(LANGUAGE_MODEL, "b", history(5.0))]
    [panel] = curve_panels(runs)  # default for a LM: perplexity
    assert panel.metric == "perplexity" and panel.log_y
    by = {(s.run, s.scope): s for s in panel.series}
    assert set(by) == {("a", "clients"), ("a", "central"), ("b", "clients"), ("b", "central")}
    clients = by[("a", "clients")]
    assert clients.rounds == [0, 1, 2]
    assert clients.band is not None
    assert clients.band[0] == [math.exp(3.5), math.exp(2.5), math.exp(1.5)]
    assert clients.band[1] == [math.exp(4.5), math.exp(3.5), math.exp(2.5)]
    assert by[("a", "central")].band is None  # no spread over clients for one test set
    [loss] = curve_panels(runs, ["loss"])
    assert by[("b", "clients")].values[0] == math.exp(5.0) and not loss.log_y
    png = overlaid_curves([panel, loss], "two runs", tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_metric_no_run_logged_gives_no_panel():
    assert curve_panels([record(CLASSIFIER, "a", history(4.0))], ["mcc"]) == []


def test_curves_drawn_against_the_simulated_clock(tmp_path):
    rows = [(0, {"eval/central/accuracy": 0.5, "sys/sim_clock_s": 12.5}), (1, {"eval/central/accuracy": 0.7})]
    rows.append((2, {"eval/central/accuracy": 0.8, "sys/sim_clock_s": 40.0}))
    [panel] = curve_panels([record(CLASSIFIER, "a", rows)], ["accuracy"], x="sys/sim_clock_s")
    [central] = panel.series
    assert central.rounds == [12.5, 40.0] and central.values == [0.5, 0.8]  # round 1 logged no clock
    assert panel.x_label == "sys/sim_clock_s"
    png = overlaid_curves([panel], "on the clock", tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
