"""``raysim compare`` on runs logged to a temporary SQLite MLflow store: two tiny classifiers in
one experiment and a tiny language model with held-out clients and personalization in another."""

import csv
import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from jobs import tiny_job
from raysim.cli.main import main
from raysim.config import JobConfig
from raysim.engine.loop import run
from raysim.results.run_store import RunStore
from raysim.results.tables import RunRecord
from raysim.tracking.tracking_store import artifact_repository

LANGUAGE_MODEL = {
    "name": "lm",
    "dataset": {"name": "pydoc_topics", "seq_len": 32, "tokenizer": {"kind": "bytes"}, "test_fraction": 0.5},
    "model": {"name": "hf_causal_lm", "arch": "gpt2", "preset": "tiny"},
    "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 4, "lr": 0.05}},
    "engine": {"num_rounds": 2, "cohort_size": 4, "max_client_examples": 8},
    "evaluation": {
        "every": 1,
        "clients": 6,
        "heldout_fraction": 0.2,
        "heldout_clients": 4,
        "personalization": {"fractions": [0.25, 0.5], "batch_size": 4},
    },
    "resources": {"backend": "serial"},
    "tracking": {"enabled": True, "experiment": "lm", "progress": False},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Runs fedavg and fedprox (experiment "digits") and a LM (experiment "lm") into one store."""
    folder = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", uri)
        tracking = {"enabled": True, "experiment": "digits", "progress": False}
        runs = [
            run(tiny_job(name=name, algorithm={"name": name}, tracking=tracking), output_dir=folder / "out")
            for name in ("fedavg", "fedprox")
        ]
        lm = run(JobConfig.from_dict(LANGUAGE_MODEL), output_dir=folder / "out")
    RUN_TABLE.update({r.run_id: RunRecord.of_result(r).fields() for r in [*runs, lm]})
    return uri, {r.job.name: r.run_id for r in [*runs, lm]}, folder


RUN_TABLE: dict = {}  # each run's fields as `raysim run`'s own table shows them


def test_compare_shows_the_time_and_rounds_raysim_runs_table_showed(store):
    """One definition of `time s`: the rounds' wall time, the same read back from MLflow."""
    uri, ids, _ = store
    runs, _ = RunStore(uri).resolve(list(ids.values()))
    for record in RunStore(uri).records(runs, None):
        shown = RUN_TABLE[record.run_id]
        assert record.fields()["time_s"] == pytest.approx(shown["time_s"], rel=1e-9)
        assert record.fields()["rounds"] == shown["rounds"]


def compare(store, *args):
    uri, _, folder = store
    return main(["compare", *args, "--tracking-uri", uri])


def comparison_runs(uri, experiment):
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return [r for r in found if r.data.tags.get("raysim.kind") == "comparison"]


def test_an_experiment_is_compared_and_logged_as_a_comparison_run(store, capsys, tmp_path):
    uri, ids, _ = store
    assert compare(store, "digits", "--out", str(tmp_path)) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines() if line.split()[:1] in (["fedavg"], ["fedprox"])]
    assert names == ["fedavg", "fedprox"]  # oldest first, both
    assert "algorithm" not in out  # the runs are named after their algorithms: no column repeats it
    assert "acc" in out and "ppl" not in out
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    [logged] = comparison_runs(uri, "digits")
    assert logged.info.run_name == "compare/fedavg,fedprox"
    assert logged.data.tags["raysim.compared_runs"] == f"{ids['fedavg']},{ids['fedprox']}"
    assert logged.info.run_id in out  # the link line
    listed = artifact_repository(uri, logged.info.run_id).list_artifacts()  # a relative location
    artifacts = {a.path: a.file_size for a in listed}
    assert set(artifacts) == {"curves.png", "final_metrics.csv", "final_metrics.md"}
    assert all(size > 0 for size in artifacts.values())
    # the table's values are the runs' last logged ones
    client = MlflowClient(uri)
    with open(tmp_path / "final_metrics.csv") as handle:
        table = {row["run_id"]: row for row in csv.DictReader(handle)}
    for run_id in (ids["fedavg"], ids["fedprox"]):
        logged_acc = client.get_run(run_id).data.metrics["eval/clients/accuracy"]
        assert float(table[run_id]["eval/clients/accuracy"]) == logged_acc

    # comparing again leaves the comparison run out of the experiment's runs
    assert compare(store, "digits", "--out", str(tmp_path), "--no-log") == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.split()[:1] in (["fedavg"], ["fedprox"])]) == 2
    assert len(comparison_runs(uri, "digits")) == 1  # --no-log logged nothing


def test_comparing_the_same_runs_again_reuses_their_comparison_run(store, tmp_path):
    uri, _, _ = store
    for _ in range(2):
        assert compare(store, "digits", "--out", str(tmp_path)) == 0
    assert compare(store, "digits", "--out", str(tmp_path), "--metric", "loss") == 0  # other options
    after = comparison_runs(uri, "digits")  # with the first test's: one run per set of options
    assert len(after) == 2 and len({r.data.tags.get("raysim.comparison_key") for r in after}) == 2


def test_a_language_model_is_compared_in_perplexities(store, capsys, tmp_path):
    uri, ids, _ = store
    assert compare(store, ids["lm"], "fedavg", "--out", str(tmp_path), "--no-log") == 0  # an id and a name
    out = capsys.readouterr().out
    assert "causal_lm" in out and "classification" in out  # a table per task
    assert "pers. 25%" in out and "held-out" in out
    with open(tmp_path / "final_metrics.csv") as handle:
        [lm] = [row for row in csv.DictReader(handle) if row["run_id"] == ids["lm"]]
    metrics = MlflowClient(uri).get_run(ids["lm"]).data.metrics
    assert float(lm["eval/heldout/perplexity"]) == metrics["eval/heldout/perplexity"]
    personalized = math.exp(metrics["eval/heldout/personalized_50/loss"])
    assert float(lm["eval/heldout/personalized_50/perplexity"]) == pytest.approx(personalized, rel=1e-12)
    assert Path(tmp_path / "curves.png").is_file()


def test_unknown_names_and_metrics_are_clear_errors(store, capsys):
    assert compare(store, "no-such-run") == 2
    err = capsys.readouterr().err
    assert "'no-such-run' is no run id, experiment or run name" in err and "'digits'" in err
    assert compare(store, "digits", "--metric", "bleu", "--no-log") == 2
    assert "no compared run logged bleu" in capsys.readouterr().err
    assert compare(store, "digits", "--x", "nosuch/metric", "--no-log") == 2  # "no curves" before
    assert "--x nosuch/metric: no compared run logged it" in capsys.readouterr().err


def test_where_keeps_the_runs_with_that_param_or_tag(store, capsys, tmp_path):
    uri, ids, _ = store
    assert compare(store, "digits", "--where", "algorithm=fedprox", "--no-log", "--out", str(tmp_path)) == 0
    rows = [
        line.split()[0]
        for line in capsys.readouterr().out.splitlines()
        if line.split()[:1] in (["fedavg"], ["fedprox"])
    ]
    assert rows == ["fedprox"]
    assert compare(store, "digits", "--where", "seed=5", "--no-log") == 2
    assert "no run of digits has seed=5" in capsys.readouterr().err


def test_runs_lists_the_stores_runs_newest_first(store, capsys):
    uri, ids, _ = store
    assert main(["runs", "digits", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if ids["fedavg"] in line or ids["fedprox"] in line]
    assert [line.split()[1] for line in lines] == ["fedprox", "fedavg"]  # newest first
    assert all("FINISHED" in line for line in lines)
    assert main(["runs", "--where", "algorithm=fedavg", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert ids["fedavg"] in out and ids["fedprox"] not in out and ids["lm"] in out  # the LM is FedAvg too


def test_cost_prints_and_writes_what_each_run_cost(store, capsys, tmp_path):
    """The tiny MLP (64-16-10, 1,210 parameters, 1,184 MACs an example) with 6 clients a round
    for 3 rounds: 3 x 6 x 1,210 parameters each way."""
    uri, ids, _ = store
    assert compare(store, ids["fedavg"], "--cost", "--no-log", "--out", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "raysim compare (cost)" in out and "peak MiB" in out and "infer MMAC" in out
    [row] = list(csv.DictReader((tmp_path / "cost.csv").open()))
    assert float(row["sys/params_up"]) == float(row["sys/params_down"]) == 3 * 6 * 1210
    assert float(row["sys/macs_per_example"]) == float(row["sys/inference_macs_per_example"]) == 1184
    assert float(row["sys/client_seconds"]) > 0 and float(row["sys/client_peak_bytes"]) > 0
    assert (tmp_path / "cost.md").read_text().startswith("| run | algorithm | client s |")
