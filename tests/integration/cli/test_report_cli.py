"""``raysim report`` on a temporary SQLite MLflow store: a sweep logged by hand with the real
MLflow client after the sweep's tag contract (known curves, a failed cell, a cell run twice), and
real runs of a tiny job reported as loose runs of an experiment."""

import csv
import io

import pytest
from mlflow.tracking import MlflowClient

from jobs import tiny_job
from raysim.cli.main import main
from raysim.engine.loop import run
from raysim.tracking.tracking_store import artifact_repository

TEST, VALID = "eval/central/accuracy", "eval/heldout/accuracy"
# (variant, lr, seed) -> (final test accuracy, final validation accuracy); None: the cell failed
CELLS = {
    ("fedavg", "0.01", 0): (0.70, 0.50), ("fedavg", "0.01", 1): (0.74, 0.52),
    ("fedavg", "0.1", 0): (0.60, 0.60), ("fedavg", "0.1", 1): (0.66, 0.64),
    ("fedprox", "0.01", 0): (0.80, 0.70), ("fedprox", "0.01", 1): None,
    ("fedprox", "0.1", 0): (0.90, 0.40), ("fedprox", "0.1", 1): (0.92, 0.42),
}  # fmt: skip


def log_cell(client, experiment, variant, lr, seed, values, status):
    cell = f"variant={variant},lr={lr},seed={seed}"
    tags = {"raysim.sweep": "sw1", "raysim.cell": cell, "raysim.axis.variant": variant,
            "raysim.axis.seed": str(seed), "raysim.axis.algorithm.local.lr": lr}  # fmt: skip
    made = client.create_run(experiment, run_name=f"grid/{cell}", tags=tags)
    if values is not None:
        test, valid = values
        for step, (t, v) in enumerate([(0.1, 0.1), (test, valid)]):  # rounds 0 and 1
            client.log_metric(made.info.run_id, TEST, t, step=step)
            client.log_metric(made.info.run_id, VALID, v, step=step)
            client.log_metric(made.info.run_id, "sys/bytes_up", 1e6, step=step)
    client.set_terminated(made.info.run_id, status)
    return made.info.run_id


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A report without ``--out`` writes under RAYSIM_HOME: here, not into the checkout."""
    monkeypatch.setenv("RAYSIM_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("grid", artifact_location=(folder / "artifacts").as_uri())
    parent = client.create_run(
        experiment, run_name="grid-sweep", tags={"raysim.kind": "sweep", "raysim.sweep": "sw1"}
    )
    # fedavg lr 0.1 seed 0 was stopped once (KILLED, other values), then finished on resume
    log_cell(client, experiment, "fedavg", "0.1", 0, (0.0, 0.99), "KILLED")
    for (variant, lr, seed), values in CELLS.items():
        log_cell(client, experiment, variant, lr, seed, values, "FAILED" if values is None else "FINISHED")
    return uri, parent.info.run_id


def report(uri, *args):
    return main(["report", *args, "--tracking-uri", uri])


def test_a_sweep_selects_on_validation_and_logs_to_its_parent(sweep, capsys, tmp_path):
    """fedavg: validation means lr 0.01: 0.51, lr 0.1: 0.62 -> 0.1, test (0.60 + 0.66) / 2 = 0.63
    (the KILLED run's 0.99 ignored); fedprox: lr 0.01: 0.70 (one finished seed), lr 0.1: 0.41 ->
    0.01, test 0.80 over 1 seed, 1 failed, although lr 0.1's test (0.91) is higher."""
    uri, parent = sweep
    args = ["--metric", TEST, "--select", "algorithm.local.lr", "--on", VALID]
    assert report(uri, "sw1", *args, "--format", "csv", "--out", str(tmp_path), "--curves", "--cost") == 0
    out = capsys.readouterr().out
    rows = {r["row"]: r for r in csv.DictReader(io.StringIO(out[: out.index("wrote")]))}
    assert (rows["fedavg"]["chosen"], float(rows["fedavg"]["mean"])) == ("0.1", pytest.approx(0.63))
    assert rows["fedavg"]["std"] == f"{0.0424264:.6g}"  # sqrt(2 * 0.03²)
    assert (rows["fedprox"]["chosen"], rows["fedprox"]["mean"], rows["fedprox"]["num_failed"]) == (
        "0.01",
        "0.8",
        "1",
    )
    assert rows["fedprox"]["best"] == "1"
    listed = {a.path for a in artifact_repository(uri, parent).list_artifacts("report")}
    assert listed == {f"report/{f}" for f in ("table.md", "table.tex", "table.csv", "curves.png")}
    markdown = (tmp_path / "table.md").read_text()
    assert (
        "algorithm.local.lr chosen per variant and column by the highest mean over seeds of eval/heldout"
        in markdown
    )
    assert "| fedprox | **0.8000 (1†)** |" in markdown and "| 2.0 |" in markdown  # 2 MB up per run


def test_the_parent_run_name_or_id_names_the_sweep_too(sweep, capsys):
    uri, parent = sweep
    args = ["--metric", TEST, "--select", "algorithm.local.lr", "--on", VALID, "--no-log", "--paired"]
    for target in ("grid-sweep", parent):
        assert report(uri, target, *args, "fedavg", "fedprox") == 0
        out = capsys.readouterr().out
        assert "| 0.6300 ± 0.0424 (2) |" in out
        assert "| all | 1 | 0 | 0 | 1 | -0.2000 |" in out  # seed 0 only: 0.60 - 0.80


def test_bad_reports_are_one_error_each(sweep, capsys):
    uri, _ = sweep
    assert report(uri, "sw1", "--metric", TEST, "--no-log") == 2
    assert "the runs differ in algorithm.local.lr (0.01, 0.1): place each with" in capsys.readouterr().err
    assert (
        report(uri, "sw1", "--metric", TEST, "--select", "algorithm.local.lr", "--on", TEST, "--no-log") == 2
    )
    assert "a test metric" in capsys.readouterr().err
    assert (
        report(uri, "sw1", "--metric", "eval/central/loss", "--columns", "algorithm.local.lr", "--no-log")
        == 2
    )
    err = capsys.readouterr().err
    assert "eval/central/loss is not logged by 7 of 8 runs: grid/variant=fedavg,lr=0.01,seed=0" in err


def test_real_runs_of_a_tiny_job_as_loose_runs(tmp_path, capsys, monkeypatch):
    """Two learning rates x two seeds of a 2-round job with a validation split: seeds and
    learning rates from the runs' params; the learning rate with the higher mean final
    validation accuracy (as MLflow holds them) is chosen, and its mean test accuracy reported."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking = {"enabled": True, "experiment": "tiny", "progress": False}
    ids = {
        (lr, seed): run(tiny_job(name="fedavg", seed=seed, algorithm={"local": {"lr": lr}}, tracking=tracking,
                                 dataset={"validation_fraction": 0.25}, engine={"num_rounds": 2}),
                        output_dir=tmp_path / "out").run_id
        for lr in (0.02, 0.5) for seed in (0, 1)
    }  # fmt: skip
    metric, valid = "eval/clients/accuracy", "eval/validation/accuracy"
    assert report(uri, "tiny", "--metric", "eval/central/accuracy", "--no-log") == 2  # digits: no central set
    assert "(evaluation metrics: eval/clients/accuracy," in capsys.readouterr().err
    assert report(uri, "tiny", "--metric", metric, "--no-log") == 2
    assert "differ in algorithm.local.lr (0.02, 0.5): place these with" in capsys.readouterr().err
    args = ["--select", "algorithm.local.lr", "--on", valid, "--format", "csv", "--out", str(tmp_path / "r")]
    assert report(uri, "tiny", "--metric", metric, *args) == 0
    out = capsys.readouterr().out
    [row] = csv.DictReader(io.StringIO(out[: out.index("wrote")]))
    client = MlflowClient(uri)
    logged = {key: client.get_run(run_id).data.metrics for key, run_id in ids.items()}
    mean = {lr: {m: (logged[lr, 0][m] + logged[lr, 1][m]) / 2 for m in (metric, valid)} for lr in (0.02, 0.5)}
    chosen = max((0.02, 0.5), key=lambda lr: mean[lr][valid])
    assert (row["row"], row["num_seeds"], row["seeds"]) == ("fedavg", "2", "0;1")
    assert float(row["chosen"]) == chosen and float(row["mean"]) == pytest.approx(
        mean[chosen][metric], abs=1e-6
    )
    [made] = [r for r in client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
              if r.data.tags.get("raysim.kind") == "report"]  # fmt: skip
    assert {a.path for a in artifact_repository(uri, made.info.run_id).list_artifacts()} >= {"table.md"}
    assert report(uri, "tiny", "--metric", metric, "--columns", "algorithm.local.lr", "--format", "csv",
                  "--no-log") == 0  # the report run is no row  # fmt: skip
    table = capsys.readouterr().out.split("wrote")[0].strip().splitlines()
    assert [line.split(",")[:2] for line in table[1:]] == [["fedavg", "0.02"], ["fedavg", "0.5"]]
