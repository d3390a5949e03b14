"""The how-to's plugin (algorithms/fedavg_clip.py) run end to end, against a numpy reference.

Job: logistic regression (``mlp`` without hidden layers) on sklearn digits, serial backend,
2 rounds of a cohort of 4, one full-batch local step per client (the batch holds all of a
client's rows, so shuffling cannot matter). For each client k of round r, from the global
(W, b):
    g_k = the mean cross-entropy gradient on its train rows;  d_k = lr * g_k
    d_k <- d_k * min(1, C / ||d_k||)          (norm over weight and bias together)
    (W, b) <- (W, b) - server_lr * 0.5**r * sum_k n_k d_k / sum_k n_k
C is the median of round 0's norms, so two of its clients clip and two do not. The cohorts are
read from the run's cohorts.json; the data and the initial model come from the store and the
model zoo.
"""

import json

import numpy as np
import pytest

from jobs import tiny_job
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.runtime.builders import build_job_model
from raysim.sampling import sample_cohort

LR, DECAY, SERVER_LR = 0.5, 0.5, 1.0


def grad(w, b, x, y):
    """Gradient of the mean cross-entropy of softmax(x @ w.T + b)."""
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = p - np.eye(w.shape[0])[y]
    return err.T @ x / len(x), err.mean(0)


def client_delta(w, b, data, clip_norm):
    x, y = data.arrays["x"].reshape(len(data), -1).astype(np.float64), data.arrays["y"]
    gw, gb = grad(w, b, x, y)
    dw, db = LR * gw, LR * gb
    norm = np.sqrt((dw**2).sum() + (db**2).sum())
    scale = min(1.0, clip_norm / norm)
    return dw * scale, db * scale, norm, len(data)


def job(clip_norm=1.0):
    return tiny_job(
        model={"name": "mlp", "hidden": []},
        algorithm={
            "name": "fedavg_clip",
            "clip_norm": clip_norm,
            "server_lr_decay": DECAY,
            "server": {"lr": SERVER_LR},
            "local": {"epochs": 1, "batch_size": 10_000, "lr": LR},
        },
        engine={"num_rounds": 2, "cohort_size": 4},
    )


def test_two_rounds_match_the_numpy_reference(tmp_path):
    unclipped = job()
    store = open_dataset(unclipped.dataset.name, unclipped.dataset.config)
    model = build_job_model(unclipped, store.spec)
    (wkey, w0), (bkey, b0) = [(k, v.detach().double().numpy()) for k, v in model.state_dict().items()]
    cohort0 = sample_cohort(store.num_clients, 4, unclipped.seed, 0).tolist()
    norms = [client_delta(w0, b0, store.client_data(c, "train"), np.inf)[2] for c in cohort0]
    clip_norm = float(np.median(norms))

    result = run(job(clip_norm), output_dir=tmp_path)
    cohorts = json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"]
    assert len(cohorts) == 2 and cohorts[0] == cohort0
    w, b = w0, b0
    for round_num, cohort in enumerate(cohorts):
        deltas = [client_delta(w, b, store.client_data(c, "train"), clip_norm) for c in cohort]
        n = np.array([d[3] for d in deltas], float)
        mean_w = sum(d[0] * k for d, k in zip(deltas, n)) / n.sum()
        mean_b = sum(d[1] * k for d, k in zip(deltas, n)) / n.sum()
        lr = SERVER_LR * DECAY**round_num
        w, b = w - lr * mean_w, b - lr * mean_b
        metrics = dict(result.history)[round_num]
        norms = np.array([d[2] for d in deltas])
        assert metrics["clip/norm"] == pytest.approx((norms * n).sum() / n.sum(), rel=1e-5)
        assert metrics["clip/clipped"] == pytest.approx(((norms > clip_norm) * n).sum() / n.sum())
        assert metrics["server/lr"] == lr
    assert 0 < dict(result.history)[0]["clip/clipped"] < 1  # both branches ran
    assert np.allclose(result.state.params[wkey].numpy(), w, atol=1e-5)
    assert np.allclose(result.state.params[bkey].numpy(), b, atol=1e-5)
