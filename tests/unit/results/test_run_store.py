"""Runs found by name (one, or an error listing every candidate) and filtered by ``key=value``
on their params and tags, in a SQLite store whose runs are made directly (no training)."""

import pytest
from mlflow.tracking import MlflowClient

from raysim.errors import RaysimError
from raysim.results.analysis import attach_run
from raysim.results.run_store import RunStore, parse_where, run_named


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Experiment "study": fedavg seeds 0 and 1, fedprox seed 0 twice (one name, two runs)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('runs') / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("study")
    made = {}
    for name, algorithm, seed, lr in [
        ("study/fedavg", "fedavg", 0, "0.1"),
        ("study/fedavg seed=1", "fedavg", 1, "0.1"),
        ("study/fedprox", "fedprox", 0, "0.05"),
        ("study/fedprox", "fedprox", 0, "0.05"),
    ]:
        tags = {"algorithm": algorithm, "variant": algorithm}
        run = client.create_run(experiment, run_name=name, tags=tags)
        client.log_param(run.info.run_id, "seed", str(seed))
        client.log_param(run.info.run_id, "algorithm.local.lr", lr)
        client.set_terminated(run.info.run_id)
        made.setdefault(name, []).append(run.info.run_id)
    return uri, made


def test_a_name_one_run_has_finds_it_and_a_shared_name_lists_the_candidates(store):
    uri, made = store
    client = MlflowClient(uri)
    assert run_named(client, "study/fedavg", uri).info.run_id == made["study/fedavg"][0]
    with pytest.raises(RaysimError) as info:
        run_named(client, "study/fedprox", uri)
    message = str(info.value)
    assert message.startswith("2 runs are named 'study/fedprox': ") and "\n" not in message
    assert all(run_id in message for run_id in made["study/fedprox"])
    with pytest.raises(RaysimError, match="no MLflow run id or run name 'study/fedadam'.*raysim runs"):
        run_named(client, "study/fedadam", uri)


def test_analyze_and_eval_attach_to_a_run_by_its_name(store):
    uri, made = store
    tracker, run = attach_run("study/fedavg seed=1", uri)
    assert tracker.run_id == run.info.run_id == made["study/fedavg seed=1"][0]


def test_where_filters_on_params_and_tags_as_values(store):
    uri, made = store
    runs = RunStore(uri)
    names = lambda where: sorted(r.info.run_name for r in runs.listing("study", where))  # noqa: E731
    assert names(["seed=1"]) == ["study/fedavg seed=1"]
    assert names(["algorithm.local.lr=0.10", "variant=fedavg"]) == ["study/fedavg", "study/fedavg seed=1"]
    assert names(["seed=0", "algorithm=fedprox"]) == ["study/fedprox", "study/fedprox"]
    assert names(["no.such.key=1"]) == []
    assert len(runs.listing()) == 4
    with pytest.raises(RaysimError, match="--where 'seed': expected key=value"):
        parse_where(["seed"])
    with pytest.raises(RaysimError, match="no experiment 'stduy'.*experiments: 'study', 'Default'"):
        runs.listing("stduy")


def test_a_run_not_found_names_a_way_to_the_right_store_that_raysim_run_has(store, tmp_path):
    """``--resume NAME`` looks runs up too, and ``raysim run`` has no ``--tracking-uri``: each
    message names the config key it does have, and that key is real."""
    from raysim.cli.main import _parser
    from raysim.config import JobConfig

    uri, _ = store
    messages = []
    for target, where in [("study/nothing", uri), ("0123456789abcdef0123456789abcdef", uri)]:
        with pytest.raises(RaysimError) as info:
            attach_run(target, where)
        messages.append(str(info.value))
    with pytest.raises(RaysimError) as info:
        attach_run("study/fedavg", f"sqlite:///{tmp_path / 'none.db'}")
    messages.append(str(info.value))
    run_options = {
        o for a in _parser()._subparsers._group_actions[0].choices["run"]._actions for o in a.option_strings
    }
    assert (
        "--tracking-uri" not in run_options
        and "tracking_uri" in JobConfig.model_fields["tracking"].annotation.model_fields
    )
    for message in messages:
        assert "raysim run: tracking.tracking_uri=URI" in message and "\n" not in message, message
