"""``raysim analyze RUN_ID ...`` on a finished 3-round run logged to a temporary MLflow store.

Expected values come from plain torch on the checkpoints' weights and the central test set, and
from the run's own evaluations (at the start and after each round), not from the code under test.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

from jobs import tiny_job
from raysim.cli.main import main
from raysim.engine.loop import START_STEP, run
from raysim.measure.landscape import line_scan
from raysim.results.analysis import FinishedRun
from raysim.runtime.builders import build_job_model
from raysim.sampling import sample_eval_clients
from raysim.tracking.tracking_store import artifact_repository


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run: 3 rounds, a checkpoint after each, evaluated at the start and every round."""
    folder = tmp_path_factory.mktemp("analyze")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", uri)
        job = tiny_job(
            engine={"num_rounds": 3, "cohort_size": 6, "checkpoint_every": 1},
            evaluation={"every": 1, "at_start": True},
            tracking={"enabled": True, "experiment": "analyze", "progress": False},
        )
        result = run(job, output_dir=folder / "out")
        yield result, uri


def analyze(finished, *args):
    result, uri = finished
    return main(["analyze", result.run_id, *args, "--serial", "--tracking-uri", uri])


def direct(result, params, clients=range(20)):
    """Loss and accuracy of ``params`` on the pooled test splits of ``clients`` (digits has no
    central test set: all 20 clients, the run's ``eval/clients`` scope), in plain torch."""
    from raysim.data.prepare import open_dataset

    store = open_dataset(result.job.dataset.name, result.job.dataset.config)
    model = build_job_model(result.job, store.spec)
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in params.items()})
    model.eval()
    data = [store.client_data(int(c), "test").arrays for c in clients]
    x = torch.as_tensor(np.concatenate([d["x"] for d in data]))
    y = torch.as_tensor(np.concatenate([d["y"] for d in data]))
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).float().mean().item()


def weights(result, name):
    return torch.load(result.run_dir / "checkpoints" / name, weights_only=True)["state"]["params"]


def logged(result, uri, key):
    return {m.step: m.value for m in MlflowClient(uri).get_metric_history(result.run_id, key)}


def artifacts(result, uri, folder="analysis"):
    listed = artifact_repository(uri, result.run_id).list_artifacts(folder)  # relative to the store
    return {Path(a.path).name: a.file_size for a in listed}


def test_line_logs_its_barriers_and_plot_to_the_analyzed_run(finished, capsys):
    result, uri = finished
    assert analyze(finished, "line", "round:1", "final", "--points", "5") == 0
    assert "analysis/line/round1_final/loss_barrier" in capsys.readouterr().out
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("analyze").experiment_id])
    assert [r.info.run_id for r in runs] == [result.run_id]  # no new run
    metrics = runs[0].data.metrics
    files = artifacts(result, uri)
    assert files["line_round1_final.png"] > 1000

    curve = json.loads((result.run_dir / "analysis" / "line_round1_final.json").read_text())
    alphas, loss, accuracy = (np.array(curve[k]) for k in ("alphas", "loss", "accuracy"))
    np.testing.assert_allclose(alphas, [0, 0.25, 0.5, 0.75, 1])
    a, b = weights(result, "round_00001.pt"), weights(result, "final.pt")
    mid = {k: 0.5 * a[k] + 0.5 * b[k] for k in a}
    for alpha, params in ((1.0, a), (0.0, b), (0.5, mid)):
        want_loss, want_accuracy = direct(result, params)
        at = int(np.flatnonzero(alphas == alpha)[0])
        assert loss[at] == pytest.approx(want_loss, rel=1e-5)
        assert accuracy[at] == pytest.approx(want_accuracy)
    linear_loss = alphas * loss[-1] + (1 - alphas) * loss[0]
    assert metrics["analysis/line/round1_final/loss_barrier"] == pytest.approx(np.max(loss - linear_loss))
    linear_accuracy = alphas * accuracy[-1] + (1 - alphas) * accuracy[0]
    want = np.max(1 - accuracy / linear_accuracy)
    assert metrics["analysis/line/round1_final/accuracy_barrier"] == pytest.approx(max(want, 0.0))


def test_line_endpoints_are_the_runs_own_evaluations_of_init_and_final(finished):
    """``init`` is the model rebuilt from the seed, the one the run evaluated at the start."""
    result, uri = finished
    assert analyze(finished, "line", "init", "final", "--points", "3", "--range", "-0.5", "1.5") == 0
    curve = json.loads((result.run_dir / "analysis" / "line_init_final.json").read_text())
    alphas, loss = np.array(curve["alphas"]), np.array(curve["loss"])
    np.testing.assert_allclose(alphas, [-0.5, 0, 0.5, 1, 1.5])  # 0 and 1 added to the 3 points
    central = logged(result, uri, "eval/clients/loss")  # example-weighted: the pooled loss
    assert loss[alphas == 1.0][0] == pytest.approx(central[START_STEP], rel=1e-5)
    assert loss[alphas == 0.0][0] == pytest.approx(central[2], rel=1e-5)
    assert "line_init_final.png" in artifacts(result, uri)


def test_clients_pools_k_of_the_evaluated_clients(finished):
    result, uri = finished
    assert analyze(finished, "line", "init", "round:0", "--points", "2", "--clients", "3") == 0
    curve = json.loads((result.run_dir / "analysis" / "line_init_round0.json").read_text())
    chosen = sample_eval_clients(20, 3, result.job.seed)  # the run's pool is clients 0..19
    want_loss, want_accuracy = direct(result, weights(result, "round_00000.pt"), chosen)
    assert curve["alphas"] == [0.0, 1.0]
    assert curve["loss"][0] == pytest.approx(want_loss, rel=1e-5)
    assert curve["accuracy"][0] == pytest.approx(want_accuracy)


def test_plane_logs_the_three_models_and_their_mean(finished):
    result, uri = finished
    assert analyze(finished, "plane", "round:0", "round:1", "final", "--size", "4") == 0
    metrics = MlflowClient(uri).get_run(result.run_id).data.metrics
    key = "analysis/plane/round0_round1_final"
    models = {name: weights(result, f"round_{r:05d}.pt") for name, r in (("round0", 0), ("round1", 1))}
    models["final"] = weights(result, "final.pt")
    models["mean"] = {k: sum(m[k] for m in models.values()) / 3 for k in models["final"]}
    for name, params in models.items():
        want_loss, want_accuracy = direct(result, params)
        assert metrics[f"{key}/{name}/loss"] == pytest.approx(want_loss, rel=1e-5)
        assert metrics[f"{key}/{name}/accuracy"] == pytest.approx(want_accuracy)
    grid = json.loads((result.run_dir / "analysis" / "plane_round0_round1_final.json").read_text())
    assert np.shape(grid["loss"]) == (4, 4)
    assert metrics[f"{key}/grid_min_loss"] == pytest.approx(np.min(grid["loss"]))
    assert artifacts(result, uri)["plane_round0_round1_final.png"] > 1000


def test_trajectory_is_the_plane_through_the_last_three_rounds(finished):
    result, uri = finished
    assert analyze(finished, "trajectory", "--size", "3") == 0
    metrics = MlflowClient(uri).get_run(result.run_id).data.metrics
    round2 = direct(result, weights(result, "round_00002.pt"))[0]
    assert metrics["analysis/trajectory/round0_round1_round2/round2/loss"] == pytest.approx(round2, rel=1e-5)
    assert "trajectory_round0_round1_round2.png" in artifacts(result, uri)


def test_barrier_of_a_model_with_itself_is_zero(finished, capsys):
    result, uri = finished
    assert analyze(finished, "barrier", "final", "round:2") == 0  # round 2 is the final round
    metrics = MlflowClient(uri).get_run(result.run_id).data.metrics
    assert metrics["analysis/barrier/final_round2/loss_barrier"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["analysis/barrier/final_round2/accuracy_barrier"] == pytest.approx(0.0, abs=1e-6)


def test_analysis_metrics_go_to_the_runs_last_round_and_a_rerun_adds_a_value_there(finished, capsys):
    """The run has 3 rounds: its final evaluation and the analysis are both at step 2."""
    result, uri = finished
    key = "analysis/barrier/round0_final/loss_barrier"
    assert analyze(finished, "barrier", "round:0", "final") == 0
    assert "at step 2" in capsys.readouterr().out
    assert 2 in logged(result, uri, "eval/clients/loss")
    first = MlflowClient(uri).get_metric_history(result.run_id, key)
    assert analyze(finished, "barrier", "round:0", "final") == 0
    history = MlflowClient(uri).get_metric_history(result.run_id, key)
    assert [m.step for m in first] == [2] and [m.step for m in history] == [2, 2]


def one_line_error(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_user_errors_are_one_line_naming_the_fix(finished, tmp_path, capsys):
    result, uri = finished
    assert main(["analyze", "0123abcd", "barrier", "init", "final", "--tracking-uri", uri]) == 2
    assert "no MLflow run id or run name '0123abcd'" in one_line_error(capsys)  # a name, else
    assert analyze(finished, "line", "round:7", "final") == 2
    err = one_line_error(capsys)
    assert "no checkpoint of round 7" in err and "[0, 1, 2]" in err and "checkpoint_every" in err
    assert analyze(finished, "line", "best", "final") == 2
    assert "use final, init, round:N" in one_line_error(capsys)
    nan = torch.load(result.run_dir / "checkpoints" / "final.pt", weights_only=False)
    key = sorted(nan["state"]["params"])[-1]
    nan["state"]["params"][key].view(-1)[0] = float("nan")
    torch.save(nan, tmp_path / "nan.pt")
    before = logged(result, uri, "analysis/line/init_nan/loss_barrier")
    assert analyze(finished, "line", "init", str(tmp_path / "nan.pt")) == 2  # as eval and --resume
    assert f"nan.pt is non-finite: params/{key} holds NaN" in one_line_error(capsys)
    assert logged(result, uri, "analysis/line/init_nan/loss_barrier") == before == {}  # nothing logged
    with pytest.raises(SystemExit, match="2"):  # argparse's usage line, then its error
        analyze(finished, "line", "init", "final", "--clients", "0")
    assert "argument --clients: must be at least 1, got 0" in capsys.readouterr().err
    assert analyze(finished, "line", "init", "final", "--clients", "100000") == 2  # cut to 20 before
    assert "--clients 100000: the run evaluates 20 clients" in one_line_error(capsys)
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["analyze", result.run_id, "line", "init", "final", "--tracking-uri", missing]) == 2
    assert "no MLflow store" in one_line_error(capsys)
    assert not (tmp_path / "none.db").exists()  # not created by looking


def test_without_its_folder_final_comes_from_the_logged_artifact(finished, capsys):
    """A run whose folder moved (or an older run without the run_dir tag) still has final.pt as
    an artifact (tracking.log_checkpoint); round checkpoints are only on disk."""
    result, uri = finished
    client = MlflowClient(uri)
    client.set_tag(result.run_id, "run_dir", str(result.run_dir.parent / "moved"))
    try:
        with FinishedRun.open(result.run_id, uri, backend="serial") as analysis:
            final, last = analysis.model("final"), analysis.model("round:2")
        for key, value in weights(result, "final.pt").items():
            np.testing.assert_array_equal(final[key], value.numpy())
            np.testing.assert_array_equal(last[key], value.numpy())
        assert analyze(finished, "barrier", "round:1", "final") == 2
        assert "no checkpoint of round 1" in one_line_error(capsys)
        client.delete_tag(result.run_id, "run_dir")  # an older raysim's run
        assert analyze(finished, "barrier", "round:1", "final") == 2
        err = one_line_error(capsys)
        assert "no 'run_dir' tag" in err and "by its path" in err
    finally:
        client.set_tag(result.run_id, "run_dir", str(result.run_dir))


def test_the_ray_backend_scans_like_the_serial_one(finished, ray_local):
    result, uri = finished
    curves = []
    for backend in ("serial", "ray"):
        with FinishedRun.open(result.run_id, uri, backend=backend, num_workers=2) as analysis:
            a, b = analysis.model("init"), analysis.model("final")
            with analysis.services() as services:
                curves.append(line_scan(services, a, b, np.linspace(0, 1, 5), clients=[0, 3, 7]))
    np.testing.assert_allclose(curves[0].loss, curves[1].loss, rtol=1e-6)
    np.testing.assert_array_equal(curves[0].accuracy, curves[1].accuracy)
