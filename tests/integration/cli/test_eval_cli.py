"""``raysim eval`` on a finished 2-round digits run logged to a temporary SQLite MLflow store.

Expected values come from the source run's own final evaluation (the same evaluation, logged at
its last round) and from plain torch on the checkpoint's weights, not from the code under test.
"""

import hashlib

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from jobs import tiny_job
from raysim.cli.main import main
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.results.checkpoint_eval import evaluate_checkpoint
from raysim.runtime.builders import build_job_model
from raysim.sampling import split_population

LAST = 1  # the source run's last round: the step of its final evaluation and of the evaluation's


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished run: 2 rounds, a central test set, 20% of the clients held out and personalized
    after the last round."""
    folder = tmp_path_factory.mktemp("eval")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    job = tiny_job(
        dataset={"central_test_size": 200},
        engine={"num_rounds": 2, "cohort_size": 6},
        evaluation={"every": 1, "heldout_fraction": 0.2, "personalization": {"fractions": [0.5]}},
        tracking={"enabled": True, "experiment": "eval", "progress": False, "tracking_uri": uri},
    )
    result = run(job, output_dir=folder / "out")
    yield result, uri, folder


def children(uri, run_id):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("eval").experiment_id
    return client.search_runs([experiment], f"tags.mlflow.parentRunId = '{run_id}'")


def logged_at(uri, run_id, key):
    return {m.step: m.value for m in MlflowClient(uri).get_metric_history(run_id, key)}


def pooled_accuracy(result, clients):
    """Plain torch: the final model's accuracy on the pooled test splits of ``clients``."""
    store = open_dataset(result.job.dataset.name, result.job.dataset.config)
    model = build_job_model(result.job, store.spec)
    saved = torch.load(result.run_dir / "checkpoints" / "final.pt", weights_only=True)["state"]["params"]
    model.load_state_dict(saved)
    model.eval()
    data = [store.client_data(int(c), "test").arrays for c in clients]
    x, y = (torch.as_tensor(np.concatenate([d[k] for d in data])) for k in ("x", "y"))
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def test_a_run_folder_is_evaluated_as_a_child_run_equal_to_its_final_evaluation(source, capsys):
    result, uri, _ = source
    assert main(["eval", str(result.run_dir)]) == 0  # the store: the one the checkpoint recorded
    out = capsys.readouterr().out
    assert "eval/heldout/" in out and f"a child of run {result.run_id}" in out  # table, then where
    [child] = children(uri, result.run_id)
    assert child.info.run_name == "tiny/eval" and child.data.tags["evaluated_round"] == str(LAST)
    source_final = {k: v for k, v in result.history[-1][1].items() if k.startswith("eval/")}
    assert any(k.startswith("eval/heldout/") for k in source_final)  # personalized held-out clients
    assert any(k.startswith("eval/clients/") for k in source_final) and "eval/central/loss" in source_final
    evaluated = {k: v for k, v in child.data.metrics.items() if k.startswith("eval/")}
    assert evaluated.keys() == source_final.keys()
    for key, value in source_final.items():
        assert logged_at(uri, child.info.run_id, key) == {LAST: pytest.approx(value, rel=1e-6)}, key
    train_pool, _ = split_population(20, 0.2, result.job.seed)
    assert evaluated["eval/clients/accuracy"] == pytest.approx(pooled_accuracy(result, train_pool))


def test_no_training_happens_and_other_stores_tag_their_parent(source):
    """Personalization fine-tunes copies in the workers; the evaluated model stays the checkpoint's.
    A store that does not hold the source run gets a ``parent_run`` tag instead of a parent."""
    result, uri, folder = source
    final = result.run_dir / "checkpoints" / "final.pt"
    before = hashlib.sha256(final.read_bytes()).hexdigest()
    other = f"sqlite:///{folder / 'other.db'}"
    transfer = "[{name: iid, dataset: {name: digits, partition: {kind: iid, num_clients: 4}}}]"
    found = evaluate_checkpoint(
        final, ["evaluation.clients=5", f"evaluation.transfer={transfer}", f"tracking.tracking_uri={other}"]
    )
    saved = torch.load(final, weights_only=True)["state"]["params"]
    assert found.params.keys() == saved.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(found.params[name], value.numpy())
    assert hashlib.sha256(final.read_bytes()).hexdigest() == before
    assert found.metrics["eval/clients/num_clients"] == 5
    assert any(key.startswith("eval/transfer/iid/") for key in found.metrics)
    tags = MlflowClient(other).get_run(found.run_id).data.tags
    assert tags["parent_run"] == f"{result.run_id} in {uri}" and "mlflow.parentRunId" not in tags
    assert not found.is_child


def test_a_run_id_and_a_run_name_override(source):
    result, uri, _ = source
    args = ["eval", result.run_id, "--tracking-uri", uri, "tracking.run_name=final-table",
            "evaluation.clients=4"]  # fmt: skip
    assert main(args) == 0
    [child] = [r for r in children(uri, result.run_id) if r.info.run_name == "final-table"]
    assert child.data.metrics["eval/clients/num_clients"] == 4
    assert child.data.params["evaluation.clients"] == "4"  # the evaluation's own job


def test_tracking_off_only_prints(source, capsys):
    result, uri, _ = source
    before = len(children(uri, result.run_id))
    assert main(["eval", str(result.run_dir), "tracking.enabled=false", "evaluation.clients=2"]) == 0
    out = capsys.readouterr().out
    assert "eval/clients/accuracy" in out and "not logged: tracking.enabled is false" in out
    assert len(children(uri, result.run_id)) == before


def test_bad_input_is_one_line_and_exit_2(source, capsys):
    result, uri, folder = source
    before = len(children(uri, result.run_id))
    assert main(["eval", str(result.run_dir), "model.hidden=[8]"]) == 2
    assert "model.hidden: cannot change in raysim eval" in capsys.readouterr().err
    assert main(["eval", str(folder / "nothing-here")]) == 2
    assert "is neither a checkpoint file nor a run folder" in capsys.readouterr().err
    assert len(children(uri, result.run_id)) == before  # no run was started
