"""Tests of the HuggingFace models in raysim/models/text.py, offline, with tiny presets only.

Large presets are checked through their transformers configs and, for parameter counts, through
models built on the meta device (no memory). GPT-2 medium has 354,823,168 parameters and GPT-2 XL
1,557,611,200 (with the 50,257-token vocabulary and 1,024 positions), the sizes the "350m" and
"1.5b" presets stand in for.
"""

from __future__ import annotations

import os

# Before transformers is imported: a hub lookup must fail at once instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest
import torch
from torch import nn

from raysim.models import build_model
from raysim.models.hf_causal_lm import HFCausalLMConfig, causal_lm_hf_config
from raysim.models.hf_classifier import HFClassifierConfig, classifier_hf_config
from raysim.models.text import HFTokenModel
from raysim.types import DataSpec

PAD = 0
TEXT = DataSpec("classification", (12,), 3, pad_token_id=PAD)
LM = DataSpec("causal_lm", (12,), 50, pad_token_id=PAD)


def tokens(batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(1, 50, (batch, length), generator=torch.Generator().manual_seed(0))


def build(name: str, options: dict, spec: DataSpec, seed: int = 0) -> HFTokenModel:
    torch.manual_seed(seed)
    return build_model(name, options, spec).eval()


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_classifier_outputs_one_row_of_logits_per_sequence(arch):
    model = build("hf_classifier", {"arch": arch}, TEXT)
    assert model(tokens()).shape == (2, 3)
    assert model.hf.config.num_hidden_layers == 2
    assert model.hf.config.hidden_size == 64


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_causal_lm_outputs_logits_over_the_vocabulary(arch):
    model = build("hf_causal_lm", {"arch": arch}, LM)
    assert model(tokens()).shape == (2, 12, 50)
    assert model.hf.config.use_cache is False
    assert model.hf.config.num_hidden_layers == 2


@pytest.mark.parametrize(
    ("name", "options", "spec"),
    [("hf_classifier", {"arch": "bert"}, TEXT), ("hf_causal_lm", {"arch": "llama"}, LM)],
)
def test_construction_is_deterministic_under_a_seed(name, options, spec):
    first = build(name, options, spec, seed=0).state_dict()
    again = build(name, options, spec, seed=0).state_dict()
    other = build(name, options, spec, seed=1).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_classifier_masks_padding_from_the_pad_id(arch):
    """With the mask, trailing pads change nothing; unmasked, the pads are attended to."""
    model = build("hf_classifier", {"arch": arch}, TEXT)
    unmasked = HFTokenModel(model.hf, pad_token_id=None)  # same weights, no mask
    text = tokens(1, 7)
    padded = torch.cat([text, torch.full((1, 5), PAD)], dim=1)
    with torch.no_grad():
        reference, masked, attended = model(text), model(padded), unmasked(padded)
    assert torch.allclose(masked, reference, atol=1e-6)
    assert (attended - reference).abs().max() > 1e-5


def test_causal_lm_masks_left_padding():
    model = build("hf_causal_lm", {"arch": "gpt2"}, LM)
    unmasked = HFTokenModel(model.hf, pad_token_id=None)
    padded = torch.cat([torch.full((1, 4), PAD), tokens(1, 8)], dim=1)
    with torch.no_grad():
        masked, attended = model(padded)[:, 4:], unmasked(padded)[:, 4:]  # (1, 8, V)
    assert not torch.allclose(masked, attended, atol=1e-4)
    assert torch.isfinite(model(torch.full((2, 12), PAD))).all()  # all-pad rows give no NaN


@pytest.mark.parametrize("saved_part", ["classifier", "encoder"])
def test_pretrained_classifier_loads_the_saved_encoder(tmp_path, saved_part):
    """A saved 3-class classifier, or a bare encoder (as MiniLM ships), gets a new 5-class head."""
    saved = build("hf_classifier", {"arch": "bert"}, TEXT)
    (saved.hf if saved_part == "classifier" else saved.hf.bert).save_pretrained(tmp_path)
    spec = DataSpec("classification", (12,), 5, pad_token_id=PAD)
    loaded = build("hf_classifier", {"pretrained_path": str(tmp_path)}, spec, seed=1)
    before, after = saved.hf.state_dict(), loaded.hf.state_dict()
    encoder = [k for k in before if k.startswith("bert.")]
    assert encoder and all(torch.equal(before[k], after[k]) for k in encoder)
    assert loaded(tokens()).shape == (2, 5)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())


def test_pretrained_causal_lm_reproduces_the_saved_model(tmp_path):
    saved = build("hf_causal_lm", {"arch": "gpt2"}, LM)
    saved.hf.to(torch.bfloat16).save_pretrained(tmp_path)  # loading must still give float32
    saved.hf.to(torch.float32)
    loaded = build("hf_causal_lm", {"pretrained_path": str(tmp_path)}, LM, seed=1)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    with torch.no_grad():
        assert torch.allclose(loaded(tokens()), saved(tokens()), atol=1e-6)


def test_missing_pretrained_directory_raises_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        build_model("hf_causal_lm", {"pretrained_path": str(tmp_path / "nope")}, LM)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        build_model("hf_classifier", {"pretrained_path": str(tmp_path / "nope")}, TEXT)


def test_pretrained_model_must_fit_the_data(tmp_path):
    build("hf_causal_lm", {}, LM).hf.save_pretrained(tmp_path)
    other_vocab = DataSpec("causal_lm", (12,), 60, pad_token_id=PAD)
    longer = DataSpec("causal_lm", (64,), 50, pad_token_id=PAD)
    with pytest.raises(ValueError, match="vocabulary of 50"):
        build_model("hf_causal_lm", {"pretrained_path": str(tmp_path)}, other_vocab)
    with pytest.raises(ValueError, match="12 positions but the data needs 64"):
        build_model("hf_causal_lm", {"pretrained_path": str(tmp_path)}, longer)
    with pytest.raises(ValueError, match="num_layers"):
        build_model("hf_causal_lm", {"pretrained_path": str(tmp_path), "num_layers": 4}, LM)


@pytest.mark.parametrize(
    ("name", "options", "spec", "message"),
    [
        ("hf_causal_lm", {}, TEXT, "serves task 'causal_lm'"),
        ("hf_classifier", {}, LM, "serves task 'classification'"),
        ("hf_classifier", {}, DataSpec("classification", (3, 32, 32), 10), r"\(T,\)"),
        ("hf_causal_lm", {"hidden_size": 60, "num_heads": 8}, LM, "multiple of num_heads"),
        ("hf_causal_lm", {"max_positions": 8}, LM, "max_positions 8 < 12"),
        ("hf_causal_lm", {}, DataSpec("causal_lm", (12,), 50, pad_token_id=50), "outside"),
        ("hf_classifier", {"vocab_size": 10}, DataSpec("classification", (8,), 2, 10), "outside"),
    ],
)
def test_rejects_specs_and_sizes_it_cannot_handle(name, options, spec, message):
    with pytest.raises(ValueError, match=message):
        build_model(name, options, spec)


def test_overrides_replace_the_preset_sizes():
    options = {"num_layers": 3, "hidden_size": 96, "num_heads": 4, "intermediate_size": 200}
    model = build("hf_classifier", {"arch": "distilbert", **options, "vocab_size": 99}, TEXT)
    config = model.hf.config
    assert (config.n_layers, config.dim, config.n_heads, config.hidden_dim) == (3, 96, 4, 200)
    assert config.vocab_size == 99


def test_roberta_reserves_positions_after_the_pad_id():
    """RoBERTa numbers positions from pad_token_id + 1, so T tokens need T + pad + 1 slots."""
    no_pad = DataSpec("classification", (12,), 3)
    padded = classifier_hf_config(HFClassifierConfig(arch="roberta"), TEXT)
    assert padded.max_position_embeddings == 12 + PAD + 1
    config = classifier_hf_config(HFClassifierConfig(arch="roberta"), no_pad)
    assert (config.pad_token_id, config.max_position_embeddings) == (1, 12 + 1 + 1)
    assert classifier_hf_config(HFClassifierConfig(arch="bert"), no_pad).pad_token_id is None


def test_base_classifier_preset_has_bert_base_sizes():
    config = classifier_hf_config(HFClassifierConfig(preset="base"), TEXT)
    sizes = (config.num_hidden_layers, config.hidden_size, config.num_attention_heads)
    assert sizes + (config.intermediate_size, config.vocab_size) == (12, 768, 12, 3072, 30522)


@pytest.mark.parametrize(
    ("preset", "layers", "width", "heads", "expected"),
    [("350m", 24, 1024, 16, 354_823_168), ("1.5b", 48, 1600, 25, 1_557_611_200)],
)
def test_large_gpt2_presets_match_gpt2_medium_and_xl(preset, layers, width, heads, expected):
    from transformers import AutoModelForCausalLM

    spec = DataSpec("causal_lm", (1024,), 50_257)
    config = causal_lm_hf_config(HFCausalLMConfig(preset=preset), spec)
    sizes = (config.n_layer, config.n_embd, config.n_head, config.n_positions)
    assert sizes == (layers, width, heads, 1024)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_llama_presets_use_swiglu_width_and_tied_embeddings():
    spec = DataSpec("causal_lm", (256,), 32_000)
    config = causal_lm_hf_config(HFCausalLMConfig(arch="llama", preset="1.5b"), spec)
    # 8 * 1600 / 3 = 4266.7, rounded up to a multiple of 64.
    sizes = (config.num_hidden_layers, config.hidden_size, config.intermediate_size)
    assert sizes == (48, 1600, 4288)
    assert config.tie_word_embeddings and config.max_position_embeddings == 256


def test_wrapper_exposes_the_inner_model_for_peft():
    model = build("hf_causal_lm", {}, LM)
    assert isinstance(model.hf, nn.Module)
    assert type(model.hf).__name__ == "GPT2LMHeadModel"
