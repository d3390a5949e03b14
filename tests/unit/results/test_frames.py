"""The Python API's read side: ``runs``, ``compare`` and ``report`` as DataFrames and a figure, read
from a SQLite store whose runs are made directly (no training)."""

import pytest
from matplotlib.figure import Figure
from mlflow.tracking import MlflowClient

from raysim.errors import RaysimError
from raysim.results.frames import RUN_COLUMNS, compare, report, runs


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """Experiment "study": fedavg and fedprox, seeds 0 and 1, three rounds of client accuracy."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('frames') / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("study")
    for algorithm, seed, final in [
        ("fedavg", 0, 0.8),
        ("fedavg", 1, 0.9),
        ("fedprox", 0, 0.7),
        ("fedprox", 1, 0.6),
    ]:
        name = f"study/{algorithm} seed={seed}"
        run = client.create_run(
            experiment, run_name=name, tags={"algorithm": algorithm, "variant": algorithm}
        )
        client.log_param(run.info.run_id, "seed", str(seed))
        client.log_param(run.info.run_id, "algorithm.name", algorithm)
        for step, accuracy in enumerate([0.2, 0.5, final]):
            client.log_metric(run.info.run_id, "eval/clients/accuracy", accuracy, step=step)
        client.set_terminated(run.info.run_id)
    return uri


def test_runs_is_raysim_runs_as_a_data_frame(uri):
    frame = runs("study", where=["algorithm=fedprox"], tracking_uri=uri)
    assert list(frame.columns) == list(RUN_COLUMNS)
    assert sorted(frame["name"]) == ["study/fedprox seed=0", "study/fedprox seed=1"]
    assert set(frame["status"]) == {"FINISHED"} and len(runs(tracking_uri=uri, limit=3)) == 3


def test_compare_gives_the_final_metrics_and_the_curves(uri):
    comparison = compare("study/fedavg seed=1", "study/fedprox seed=0", tracking_uri=uri)
    table = comparison.table.set_index("run")
    assert table.loc["study/fedavg seed=1", "eval/clients/accuracy"] == 0.9
    assert table.loc["study/fedprox seed=0", "eval/clients/accuracy"] == 0.7
    figure = comparison.figure()
    assert isinstance(figure, Figure) and len(figure.axes[0].lines) == 2
    assert comparison.cost is None  # nothing logged its costs
    with pytest.raises(RaysimError, match="no compared run logged mcc"):
        compare("study", metrics=["mcc"], tracking_uri=uri)


def test_report_is_the_table_over_seeds_one_row_per_cell(uri):
    frame = report("study", metric="eval/clients/accuracy", tracking_uri=uri)
    by_row = frame.set_index("row")
    assert by_row.loc["fedavg", "mean"] == pytest.approx(0.85) and by_row.loc["fedavg", "num_seeds"] == 2
    assert by_row.loc["fedavg", "best"] == 1 and by_row.loc["fedprox", "best"] == 0
    with pytest.raises(RaysimError, match="select= and on= go together"):
        report("study", metric="eval/clients/accuracy", select="seed", tracking_uri=uri)
