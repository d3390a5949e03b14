"""GLUE end to end, offline: local files in GLUE's schema -> store -> two FedAvg rounds of a tiny
RoBERTa with LoRA (FedGuCci's r = alpha = 8 on query and value, bias "all", trained head).

The logged scores are checked against sklearn and scipy on predictions computed here from the
final global model: the central score on the dev split, and the clients' score on all their test
rows together (pooled, not a mean of per-client scores).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from scipy.stats import pearsonr
from sklearn.metrics import matthews_corrcoef

from jobs import tiny_job
from raysim import params as P
from raysim.config import JobConfig
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.runtime.builders import build_job_model

WORDS = ["good", "bad", "fine", "poor", "nice", "dull", "bright", "dark"]
LORA = {"r": 8, "alpha": 8, "target_modules": ["query", "value"], "dropout": 0.0, "bias": "all"}


def sentences(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Random 3-6 word sentences; the first word (even: positive) decides the class."""
    rng = np.random.default_rng(seed)
    words = [rng.choice(len(WORDS), rng.integers(3, 7)) for _ in range(n)]
    return [" ".join(WORDS[i] for i in w) for w in words], np.array([1 - w[0] % 2 for w in words])


def glue_job(tmp_path, dataset: dict) -> JobConfig:
    raw = tiny_job().to_dict()
    raw["dataset"] = {
        "name": "glue",
        "tokenizer": {"kind": "bytes"},
        "max_length": 32,
        "partition": {"kind": "iid", "num_clients": 4},
        "test_fraction": 0.25,
        "cache_dir": str(tmp_path / "cache"),
        **dataset,
    }
    raw["model"] = {
        "name": "hf_classifier",
        "arch": "roberta",
        "preset": "tiny",
        "vocab_size": 258,
        "lora": LORA,
    }
    raw["algorithm"] = {
        "name": "fedavg",
        "local": {"epochs": 2, "batch_size": 4, "lr": 3e-3, "optimizer": "adam"},
    }
    raw["engine"] = {"num_rounds": 2, "cohort_size": 4}
    return JobConfig.from_dict(raw)


def final_outputs(job: JobConfig, params) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The final model's outputs and targets on the dev split and on every client's test rows."""
    store = open_dataset("glue", job.dataset.config)
    model = build_job_model(job, store.spec)
    P.load_into(model, params)
    model.eval()

    def outputs(arrays):
        with torch.no_grad():
            return model(torch.from_numpy(arrays["x"])).double().numpy(), arrays["y"]

    central = outputs(store.central_test().arrays)
    tests = [outputs(store.client_data(c, "test").arrays) for c in range(store.num_clients)]
    return *central, np.concatenate([o for o, _ in tests]), np.concatenate([y for _, y in tests])


def test_cola_reports_mcc_of_the_dev_set_and_of_the_pooled_clients(tmp_path):
    files = {}
    for split, n, seed in (("train", 64, 0), ("validation", 24, 1)):
        texts, labels = sentences(n, seed)
        rows = [{"sentence": t, "label": int(y), "idx": i} for i, (t, y) in enumerate(zip(texts, labels))]
        path = tmp_path / f"{split}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        files[split] = str(path)
    job = glue_job(tmp_path, {"task": "cola", "data_files": files})
    result = run(job, output_dir=tmp_path / "out")
    final = result.final
    assert not any("sums/" in key for key in final)
    sent = result.state.params
    assert all(".lora_" in k or "classifier" in k or k.endswith(".bias") for k in sent)
    logits, y, client_logits, client_y = final_outputs(job, sent)
    predicted = logits.argmax(1)
    assert len(set(predicted)) == 2  # the score is not the degenerate 0 of a constant prediction
    assert final["eval/central/mcc"] == pytest.approx(matthews_corrcoef(y, predicted), abs=1e-9)
    assert final["eval/central/accuracy"] == pytest.approx((predicted == y).mean())
    pooled = matthews_corrcoef(client_y, client_logits.argmax(1))
    assert final["eval/clients/mcc"] == pytest.approx(pooled, abs=1e-9)
    assert len(result.history) == 2


def test_stsb_trains_a_regressor_and_reports_pearson(tmp_path):
    files = {}
    for split, n, seed in (("train", 64, 2), ("validation", 24, 3)):
        first, _ = sentences(n, seed)
        second, _ = sentences(n, seed + 10)
        scores = np.random.default_rng(seed).uniform(0, 5, n).astype(np.float32)
        table = pa.table({"sentence1": first, "sentence2": second, "label": scores, "idx": np.arange(n)})
        pq.write_table(table, tmp_path / f"{split}.parquet")
        files[split] = str(tmp_path / f"{split}.parquet")
    job = glue_job(tmp_path, {"task": "stsb", "data_files": files})
    result = run(job, output_dir=tmp_path / "out")
    final = result.final
    predictions, y, client_predictions, client_y = final_outputs(job, result.state.params)
    assert predictions.shape == (24, 1) and y.dtype == np.float32
    assert final["eval/central/pearson"] == pytest.approx(pearsonr(predictions[:, 0], y).statistic, abs=1e-6)
    assert final["eval/central/loss"] == pytest.approx(np.mean((predictions[:, 0] - y) ** 2), rel=1e-4)
    pooled = pearsonr(client_predictions[:, 0], client_y).statistic
    assert final["eval/clients/pearson"] == pytest.approx(pooled, abs=1e-6)
    first, last = result.history[0][1]["train/loss"], result.history[-1][1]["train/loss"]
    assert last < first  # the MSE falls as the head learns the scores' scale
