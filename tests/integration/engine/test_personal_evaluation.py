"""Evaluation that uses client state: each evaluated client's own predictor on its test split."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jobs import tiny_job
from raysim import params as P
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.models import build_model
from raysim.registry import get
from raysim.runtime.client_state import ClientStateStore

FEDROD = {"name": "fedrod", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}}


def test_fedrods_personal_heads_are_measured_on_each_clients_test_split(tmp_path):
    """eval/personal/loss_mean and accuracy_mean are the means over the evaluated clients of the
    cross-entropy and accuracy of g + p on their test splits, p the head each client kept after
    the last round (the global head where it never trained), composed here from the run's final
    params and client-state folder."""
    job = tiny_job(algorithm=FEDROD, evaluation={"every": 1, "clients": 8})
    result = run(job, output_dir=tmp_path)
    final = result.final
    assert {"eval/personal/accuracy", "eval/personal/loss_p50", "eval/clients/accuracy"} <= set(final)
    assert final["eval/personal/num_clients"] == final["eval/clients/num_clients"] == 8
    assert all("eval/personal/accuracy" in m for _, m in result.history)  # every evaluation

    store = open_dataset(job.dataset.name, job.dataset.config)
    entry = get("model", job.model.name)
    model = build_model(entry.name, job.model.config, store.spec)
    P.load_into(model, result.state.params)
    states = ClientStateStore(result.run_dir / "client_state")
    expected, with_state = [], 0  # (loss, accuracy) per client
    for client in range(store.num_clients):
        test = store.client_data(client, "test")
        saved = states.get(client, before_round=job.engine.num_rounds)
        head = {"weight": model.head.weight, "bias": model.head.bias}
        if saved is not None:
            head, with_state = saved["head"], with_state + 1
        x, y = torch.as_tensor(test.arrays["x"]), torch.as_tensor(test.arrays["y"])
        with torch.no_grad():
            logits = model(x) + model.features(x) @ head["weight"].T + head["bias"]
        expected.append((float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).double().mean())))
    assert with_state > 0
    loss, accuracy = np.mean([expected[c] for c in _evaluated_clients(job, store)], axis=0)
    assert final["eval/personal/loss_mean"] == pytest.approx(loss, rel=1e-5)
    assert final["eval/personal/accuracy_mean"] == pytest.approx(accuracy, abs=1e-6)
    assert final["eval/personal/accuracy_mean"] != final["eval/clients/accuracy_mean"]


def _evaluated_clients(job, store):
    from raysim.engine.eval_plan import evaluation_plan
    from raysim.sampling import split_population

    pool, heldout = split_population(store.num_clients, job.evaluation.heldout_fraction, job.seed)
    return [int(c) for c in evaluation_plan(job, pool, heldout, {}).clients]


def test_a_plugin_without_client_state_logs_no_personal_evaluation(tmp_path):
    result = run(tiny_job(engine={"num_rounds": 1}), output_dir=tmp_path)
    assert not any(k.startswith("eval/personal/") for k in result.final)
