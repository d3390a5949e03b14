"""What GLUE needs of ``hf_classifier`` (raysim/models/text.py, lora.py): STS-B regression, LoRA with
``bias="all"`` (FedGuCci's peft settings), and padding trimmed without changing any output.

Trainable sizes by hand, for the tiny RoBERTa preset (d = 64, 2 layers, MLP 128) with one
regression output and LoRA r = 8 on query and value:

    adapters   2 layers x 2 targets x 8 (64 + 64)             4,096
    head       dense 64 x 64 + 64, out_proj 64 x 1 + 1         4,225
    biases     per layer: q, k, v, attention output, its LayerNorm, output, its LayerNorm
               (7 x 64) + intermediate 128 = 576; 2 layers = 1,152; embeddings LayerNorm 64:
                                                                1,216
so ``bias="all"`` sends 9,537 numbers and ``bias="none"`` 8,321.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from raysim import params as P  # noqa: E402
from raysim.measure.evaluate import evaluate
from raysim.models import build_model  # noqa: E402
from raysim.models.text import HFTokenModel  # noqa: E402
from raysim.train.local import LocalTrainConfig, train_local  # noqa: E402
from raysim.types import ClientData, DataSpec  # noqa: E402

PAD = 1  # RoBERTa's
STSB = DataSpec("regression", (12,), 1, pad_token_id=PAD, metrics=("pearson",))
PAIRS = DataSpec("classification", (12,), 2, pad_token_id=PAD)
LORA = {"r": 8, "alpha": 8, "target_modules": ["query", "value"], "dropout": 0.0}
ADAPTERS, HEAD, BIASES = 4_096, 4_225, 1_216


def build(options: dict, spec: DataSpec, seed: int = 0) -> HFTokenModel:
    torch.manual_seed(seed)
    return build_model("hf_classifier", options, spec).eval()


def padded_tokens(batch: int = 3, used: int = 8, length: int = 12) -> torch.Tensor:
    """Token ids in [2, 50) in the first ``used`` columns (row 0 shorter), padding after."""
    x = torch.randint(2, 50, (batch, length), generator=torch.Generator().manual_seed(0))
    x[:, used:] = PAD
    x[0, used - 3 :] = PAD
    return x


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_a_regression_spec_gets_one_output_per_sequence(arch):
    model = build({"arch": arch}, STSB)
    assert model(padded_tokens()).shape == (3, 1)
    config = model.unwrapped().config
    assert config.num_labels == 1 and config.problem_type == "regression"


def test_a_pretrained_classifier_becomes_a_regressor_with_its_encoder(tmp_path):
    saved = build({"arch": "roberta"}, PAIRS)
    saved.hf.save_pretrained(tmp_path)
    loaded = build({"pretrained_path": str(tmp_path), "lora": LORA}, STSB, seed=1)
    assert loaded(padded_tokens()).shape == (3, 1)
    assert loaded.unwrapped().config.problem_type == "regression"
    before = saved.hf.state_dict()
    after = {k.replace(".base_layer", ""): v for k, v in loaded.unwrapped().state_dict().items()}
    encoder = [k for k in before if k.startswith("roberta.")]
    assert encoder and all(torch.equal(before[k], after[k]) for k in encoder)


@pytest.mark.parametrize(("bias", "expected"), [("all", ADAPTERS + HEAD + BIASES), ("none", ADAPTERS + HEAD)])
def test_lora_bias_all_also_trains_and_sends_every_bias(bias, expected):
    model = build({"arch": "roberta", "lora": {**LORA, "bias": bias}}, STSB)
    params = P.model_params(model)
    assert P.num_elements(params) == expected
    biases = [k for k in params if k.endswith(".bias") and "classifier" not in k]
    assert len(biases) == (2 * 8 + 1 if bias == "all" else 0)
    assert not any("original_module" in k for k in params)  # the head's frozen copy stays home


def test_training_moves_only_adapters_head_and_biases():
    model = build({"arch": "roberta", "lora": {**LORA, "bias": "all"}}, STSB)
    trainable = set(P.model_params(model))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = padded_tokens(8).numpy().astype(np.int64)
    y = np.linspace(0, 5, 8).astype(np.float32)
    config = LocalTrainConfig(lr=1e-2, batch_size=8, max_steps=3, optimizer="adam")
    train_local(model.train(), ClientData({"x": x, "y": y}), config, seed=0, spec=STSB)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed <= trainable
    assert any(".lora_B." in k for k in changed) and any("classifier" in k for k in changed)
    assert any(k.endswith("LayerNorm.bias") for k in changed)


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_trimming_trailing_padding_changes_no_output(arch):
    """The forward pass drops the all-padding columns 8-11; outputs equal the untrimmed pass."""
    model = build({"arch": arch}, PAIRS)
    x = padded_tokens()
    assert model.trimmed(x).shape == (3, 8)
    full = model.hf(input_ids=x, attention_mask=(x != PAD).long()).logits
    with torch.no_grad():
        assert torch.allclose(model(x), full, atol=1e-6)
        assert model.features(x).shape[0] == 3


def test_evaluate_reports_pearson_for_a_regressor():
    model = build({"arch": "roberta"}, STSB)
    x = padded_tokens(6)
    y = np.arange(6, dtype=np.float32)
    metrics = evaluate(model, ClientData({"x": x.numpy().astype(np.int64), "y": y}), STSB)
    with torch.no_grad():
        predictions = model(x)[:, 0].double().numpy()
    assert metrics["pearson"] == pytest.approx(np.corrcoef(predictions, y)[0, 1], abs=1e-9)
    assert metrics["loss"] == pytest.approx(np.mean((predictions - y) ** 2), rel=1e-5)
