"""Held-out clients, few-shot personalization and transfer evaluation, end to end."""

import json

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.data.prepare import open_dataset
from raysim.engine.loop import build, run
from raysim.errors import ConfigError
from raysim.measure.evaluate import evaluate
from raysim.runtime.personal import _PERSONALIZE
from raysim.runtime.wire import WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.sampling import client_seed, split_population
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData

PERSONALIZE = {"fractions": [0.25, 0.5], "epochs": 2, "lr": 0.1, "batch_size": 4}


def test_heldout_clients_never_train_and_are_evaluated(tmp_path):
    job = tiny_job(engine={"num_rounds": 8}, evaluation={"heldout_fraction": 0.25})
    result = run(job, output_dir=tmp_path)
    _, heldout = split_population(20, 0.25, job.seed)
    cohorts = json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"]
    assert not set(heldout.tolist()) & {c for cohort in cohorts for c in cohort}
    assert result.final["eval/heldout/num_clients"] == 5
    assert result.final["eval/clients/num_clients"] == 15  # the training clients' test splits
    assert 0 < result.final["eval/heldout/accuracy_mean"] <= 1


def test_personalization_matches_a_hand_composed_fine_tune(tmp_path):
    job = tiny_job(evaluation={"heldout_fraction": 0.25, "personalization": PERSONALIZE})
    result = run(job, output_dir=tmp_path / "run")
    last = result.history[-1][1]
    assert "eval/heldout/personalized_50/accuracy" in last
    assert not any("personalized" in k for _, m in result.history[:-1] for k in m)  # last round only
    # client by client, the same fine-tune composed from train_local and evaluate
    store = open_dataset(job.dataset.name, job.dataset.config)
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store.path), str(tmp_path / "s")))
    _, heldout = split_population(20, 0.25, job.seed)
    weights = P.to_numpy(result.state.params)
    expected = []
    for client in heldout:
        test, pool = store.client_data(int(client), "test"), store.client_data(int(client), "train")
        shots = min(round(0.5 * (len(test) + len(pool))), len(pool))
        P.load_into(trainer.model, weights)
        seed = client_seed(job.seed, 2, int(client)) ^ _PERSONALIZE
        torch.manual_seed(seed)
        train_local(
            trainer.model,
            ClientData({k: v[:shots] for k, v in pool.arrays.items()}),
            LocalTrainConfig(epochs=2, lr=0.1, batch_size=4),
            seed=seed,
            spec=store.spec,
        )
        expected.append(evaluate(trainer.model, test, store.spec)["accuracy"])
    assert last["eval/heldout/personalized_50/accuracy_mean"] == pytest.approx(np.mean(expected))
    assert last["eval/heldout/personalized_50/accuracy_mean"] != last["eval/heldout/accuracy_mean"]


def test_heldout_metrics_cover_the_same_clients_on_personalization_and_plain_rounds(tmp_path):
    job = tiny_job(evaluation={"heldout_fraction": 0.25, "personalization": PERSONALIZE})
    store = open_dataset(job.dataset.name, job.dataset.config)
    _, heldout = split_population(20, 0.25, job.seed)
    sizes = np.sort(store.num_examples("train")[heldout] + store.num_examples("test")[heldout])
    assert sizes[1] < sizes[2]  # so a threshold at the third size leaves two held-out clients out
    options = {**PERSONALIZE, "min_examples": int(sizes[2])}
    services, state = build(
        tiny_job(evaluation={"heldout_fraction": 0.25, "personalization": options}),
        None,
        None,
        tmp_path,
    )
    try:
        assert not services.is_personalization_round(0) and services.is_personalization_round(2)
        plain, tuned = services.evaluate(state, 0), services.evaluate(state, 2)
    finally:
        services.backend.shutdown()
    assert "eval/heldout/personalized_25/accuracy" in tuned and not any("personalized" in k for k in plain)
    # the same global model on the same clients: every eval/heldout number of the global model agrees
    for key in ("num_clients", "num_skipped_clients", "accuracy", "accuracy_mean", "loss_p50"):
        assert plain[f"eval/heldout/{key}"] == pytest.approx(tuned[f"eval/heldout/{key}"], rel=1e-12), key
    assert (plain["eval/heldout/num_clients"], plain["eval/heldout/num_skipped_clients"]) == (3, 2)


def test_transfer_evaluation_on_another_dataset(tmp_path):
    other = {"name": "digits", "partition": {"kind": "iid", "num_clients": 8}, "test_fraction": 0.5}
    job = tiny_job(
        evaluation={"personalization": PERSONALIZE, "transfer": [{"name": "digits_iid", "dataset": other}]}
    )
    final = run(job, output_dir=tmp_path).final
    assert final["eval/transfer/digits_iid/num_clients"] == 8
    scope = "eval/transfer/digits_iid"
    assert {f"{scope}/accuracy", f"{scope}/personalized_25/accuracy"} <= set(final)


def test_a_transfer_dataset_the_model_cannot_read_is_a_config_error(tmp_path):
    mnist = {"name": "mnist", "partition": {"kind": "iid", "num_clients": 5}}
    with pytest.raises(ConfigError, match=r"evaluation.transfer\[0\]: 'mnist' holds"):
        run(tiny_job(evaluation={"transfer": [{"name": "mnist", "dataset": mnist}]}), output_dir=tmp_path)
    typo = {"name": "digits", "partition": {"kind": "iid", "num_clients": 5}, "test_fraktion": 0.5}
    with pytest.raises(
        ConfigError,
        match=r"evaluation.transfer\[0\].dataset.test_fraktion: unknown key; "
        r"did you mean 'test_fraction'",
    ):
        run(tiny_job(evaluation={"transfer": [{"name": "t", "dataset": typo}]}), output_dir=tmp_path)


def test_ray_and_serial_agree_on_heldout_personalization_and_transfer(tmp_path, ray_local):
    other = {"name": "digits", "partition": {"kind": "iid", "num_clients": 6}, "test_fraction": 0.5}
    sections = {
        "evaluation": {
            "heldout_fraction": 0.25,
            "personalization": PERSONALIZE,
            "transfer": [{"name": "t", "dataset": other}],
        },
    }
    serial = run(tiny_job(**sections), output_dir=tmp_path / "s").final
    on_ray = run(
        tiny_job(resources={"backend": "ray", "num_workers": 2}, **sections), output_dir=tmp_path / "r"
    ).final
    for key in (
        "eval/heldout/personalized_25/accuracy_mean",
        "eval/transfer/t/personalized_50/loss",
        "eval/heldout/accuracy",
    ):
        assert on_ray[key] == pytest.approx(serial[key], rel=1e-5), key


def test_a_schedule_cannot_train_heldout_clients(tmp_path):
    _, heldout = split_population(20, 0.25, 3)
    schedule = tmp_path / "cohorts.json"
    schedule.write_text(json.dumps({"num_clients": 20, "cohorts": [[int(heldout[0]), 1, 2, 3, 4, 5]] * 3}))
    job = tiny_job(engine={"schedule": str(schedule)}, evaluation={"heldout_fraction": 0.25})
    with pytest.raises(ConfigError, match="trains held-out clients"):
        run(job, output_dir=tmp_path / "run")


def test_heldout_evaluation_can_be_capped(tmp_path):
    final = run(
        tiny_job(evaluation={"heldout_fraction": 0.5, "heldout_clients": 3}), output_dir=tmp_path
    ).final
    assert final["eval/heldout/num_clients"] == 3
