"""Tests of LoRA on the HuggingFace text models (raysim/models/lora.py), tiny presets only.

Adapter sizes by hand. A LoRA adapter on a layer mapping ``in`` to ``out`` features holds
A (r, in) and B (out, r): ``r * (in + out)`` numbers. The tiny GPT-2 preset has 2 layers of width
d = 64 with an MLP of 4d = 256; the default targets "c_attn" and "c_proj" match three Conv1D
layers per block. With r = 8:

    attn.c_attn  64 -> 192 (q, k, v)   8 * (64 + 192)  = 2,048
    attn.c_proj  64 -> 64              8 * (64 + 64)   = 1,024
    mlp.c_proj  256 -> 64              8 * (256 + 64)  = 2,560
                                       per block         5,632;  2 blocks: 11,264

The frozen base has 104,064 parameters (vocabulary 50, 12 positions), so the model has 115,328
and the adapters are 9.8% of it (a tiny vocabulary makes that fraction large; GPT-2 small's would
be about 1%). The tiny BERT classifier adapts "query" and "value", 64 -> 64 in 2 layers:
4 * 8 * (64 + 64) = 4,096, plus a head of 64 * 3 + 3 = 195 when it trains.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim import params as P
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.text import HFTokenModel
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

PAD = 0
TEXT = DataSpec("classification", (12,), 3, pad_token_id=PAD)
LM = DataSpec("causal_lm", (12,), 50, pad_token_id=PAD)
GPT2_ADAPTERS = 2 * (8 * (64 + 192) + 8 * (64 + 64) + 8 * (256 + 64))  # 11,264
BERT_ADAPTERS = 2 * 2 * 8 * (64 + 64)  # 4,096
BERT_HEAD = 64 * 3 + 3  # 195


def tokens(batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(1, 50, (batch, length), generator=torch.Generator().manual_seed(0))


def build(name: str, options: dict, spec: DataSpec, seed: int = 0) -> HFTokenModel:
    torch.manual_seed(seed)
    return build_model(name, options, spec).eval()


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def base_name(lora_name: str) -> str:
    """The plain model's name of a base or head tensor of the LoRA model."""
    for wrapper in ("base_model.model.", ".base_layer", ".original_module", ".modules_to_save.default"):
        lora_name = lora_name.replace(wrapper, "")
    return lora_name


def test_only_gpt2_adapters_travel():
    model = build("hf_causal_lm", {"lora": {}}, LM)
    params = P.model_params(model)
    assert params and all(is_adapter(k) for k in params)
    assert P.num_elements(params) == GPT2_ADAPTERS == 11_264
    total = sum(p.numel() for p in model.parameters())
    assert total == 104_064 + GPT2_ADAPTERS
    assert P.num_elements(params) / total < 0.1
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and not any(is_adapter(n) for n in frozen)


@pytest.mark.parametrize("train_head", [True, False])
def test_classifier_sends_adapters_and_the_head_when_it_trains(train_head):
    model = build("hf_classifier", {"lora": {"train_head": train_head}}, TEXT)
    params = P.model_params(model)
    head = [k for k in params if not is_adapter(k)]
    assert all(".classifier.modules_to_save." in k for k in head)
    assert len(head) == (2 if train_head else 0)  # weight and bias
    assert P.num_elements(params) == BERT_ADAPTERS + (BERT_HEAD if train_head else 0)


@pytest.mark.parametrize(
    ("arch", "expected"),
    [("llama", 2 * 2 * 8 * (64 + 64)), ("roberta", BERT_ADAPTERS), ("distilbert", BERT_ADAPTERS)],
)
def test_default_targets_of_other_architectures(arch, expected):
    """Llama adapts q_proj and v_proj, RoBERTa query and value, DistilBERT q_lin and v_lin."""
    if arch == "llama":
        model = build("hf_causal_lm", {"arch": arch, "lora": {}}, LM)
    else:
        model = build("hf_classifier", {"arch": arch, "lora": {"train_head": False}}, TEXT)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert all(is_adapter(n) for n in trainable)
    assert sum(p.numel() for p in trainable.values()) == expected


def test_construction_is_deterministic_and_keeps_the_plain_base():
    """Same seed: equal adapters and base; the base equals the model built without LoRA."""
    first = build("hf_causal_lm", {"lora": {}}, LM, seed=0).state_dict()
    again = build("hf_causal_lm", {"lora": {}}, LM, seed=0).state_dict()
    other = build("hf_causal_lm", {"lora": {}}, LM, seed=1).state_dict()
    plain = build("hf_causal_lm", {}, LM, seed=0).state_dict()
    lora_a = [k for k in first if ".lora_A." in k]
    assert lora_a and all(torch.equal(first[k], again[k]) for k in first)
    assert not any(torch.equal(first[k], other[k]) for k in lora_a)
    base = [k for k in first if not is_adapter(k)]
    assert len(base) == len(plain)
    assert all(torch.equal(first[k], plain[base_name(k)]) for k in base)


@pytest.mark.parametrize(
    ("name", "options", "spec"),
    [
        ("hf_causal_lm", {"arch": "gpt2"}, LM),
        ("hf_causal_lm", {"arch": "llama"}, LM),
        ("hf_classifier", {"arch": "bert"}, TEXT),
    ],
)
def test_fresh_lora_starts_as_the_base_model(name, options, spec):
    """lora_B starts at zero, so B A x adds nothing although A is random."""
    plain = build(name, options, spec)
    adapted = build(name, {**options, "lora": {}}, spec)
    state = adapted.state_dict()
    assert all(not state[k].any() for k in state if ".lora_B." in k)
    assert all(state[k].any() for k in state if ".lora_A." in k)
    with torch.no_grad():
        assert torch.equal(adapted(tokens()), plain(tokens()))


def test_params_load_round_trip_and_delta():
    model = build("hf_causal_lm", {"lora": {}}, LM)
    before = P.clone(P.model_params(model))
    generator = torch.Generator().manual_seed(1)
    new = {k: torch.randn(v.shape, generator=generator) for k, v in before.items()}
    P.load_into(model, P.to_numpy(new))
    after = P.model_params(model)
    assert after.keys() == new.keys() and all(torch.equal(after[k], new[k]) for k in new)
    diff = P.delta(before, after)
    assert all(torch.equal(diff[k], before[k] - new[k]) for k in new)
    with pytest.raises(KeyError, match="not in the model"):
        P.load_into(model, new | {"hf.transformer.h.0.attn.c_attn.weight": torch.zeros(64, 192)})


def test_one_local_step_trains_only_the_adapters():
    """One SGD step moves every lora_B; lora_A's gradient is B^T (...) = 0 while B = 0."""
    model = build("hf_causal_lm", {"lora": {}}, LM)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = ClientData({"x": tokens(4).numpy().astype(np.int64)})
    config = LocalTrainConfig(lr=0.5, batch_size=4, max_steps=1)
    metrics = train_local(model, data, config, seed=0, spec=LM)
    assert metrics["train/steps"] == 1.0
    after = model.state_dict()
    for name, value in after.items():
        if ".lora_B." in name:
            assert not torch.equal(value, before[name]), name
        else:
            assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("name", ["hf_causal_lm", "hf_classifier"])
def test_lora_on_a_pretrained_local_model(tmp_path, name):
    spec = LM if name == "hf_causal_lm" else TEXT
    saved = build(name, {}, spec)
    saved.hf.save_pretrained(tmp_path)
    loaded = build(name, {"pretrained_path": str(tmp_path), "lora": {}}, spec, seed=1)
    state, saved_state = loaded.state_dict(), saved.state_dict()
    base = [k for k in state if not is_adapter(k)]  # with the saved head, for the classifier
    assert all(torch.equal(state[k], saved_state[base_name(k)]) for k in base)
    params = P.model_params(loaded)
    expected = GPT2_ADAPTERS if name == "hf_causal_lm" else BERT_ADAPTERS + BERT_HEAD
    assert P.num_elements(params) == expected
    with torch.no_grad():
        assert torch.allclose(loaded(tokens()), saved(tokens()), atol=1e-6)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"r": 0}, r"model\.lora\.r: Input should be greater than 0"),
        ({"r": -4}, r"model\.lora\.r"),
        ({"dropout": 1.0}, r"model\.lora\.dropout"),
        ({"train_head": False}, r"model\.lora\.train_head: Extra inputs"),  # classifiers only
        ({"target_modules": []}, r"model\.lora\.target_modules"),
        (
            {"target_modules": ["c_attn", "q_proj", "attn"]},
            r"\['q_proj', 'attn'\] name no .*choose from \['c_attn', 'c_fc', 'c_proj', 'lm_head'",
        ),
    ],
)
def test_bad_lora_options_are_config_errors(lora, message):
    with pytest.raises(ConfigError, match=message):
        build_model("hf_causal_lm", {"lora": lora}, LM)


def test_the_trained_head_cannot_also_be_a_target():
    with pytest.raises(ConfigError, match=r"\['classifier'\].*the head \['classifier'\] trains"):
        build_model("hf_classifier", {"lora": {"target_modules": ["classifier"]}}, TEXT)
