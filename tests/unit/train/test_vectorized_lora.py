"""Batched LoRA cohorts: a chunk of LoRA clients of the tiny GPT-2 and BERT presets trains
vectorized (``raysim.train.vmap_attention``) to what each trains alone, padding included, and its
dropout (attention dropout too) draws each client's own masks in any chunk."""

import numpy as np
import pytest
import torch
from torch import nn

from raysim import params as P
from raysim.models import build_model
from raysim.models.text import HFTokenModel
from raysim.train.local import LocalTrainConfig, train_local
from raysim.train.vectorizable import vectorization_blocker
from raysim.train.vectorized import train_local_vectorized
from raysim.types import ClientData, DataSpec

PAD = 0
LM = DataSpec("causal_lm", (12,), 50, pad_token_id=PAD)
TEXT = DataSpec("classification", (12,), 3, pad_token_id=PAD)
MODELS = {"causal_lm": ("hf_causal_lm", LM), "classifier": ("hf_classifier", TEXT)}
SIZES, SEEDS = (5, 2, 9), (11, 12, 13)  # unequal batch counts and a short last batch
CONFIG = LocalTrainConfig(lr=0.1, batch_size=2, momentum=0.9, epochs=2)


def lora_model(kind: str, dropout: bool = False, attention_dropout_only: bool = False) -> nn.Module:
    """The seeded LoRA model; without ``dropout`` every dropout layer off (the sequential loop's
    masks and the hashed ones differ), with ``attention_dropout_only`` all but attention's."""
    name, spec = MODELS[kind]
    torch.manual_seed(0)
    model = build_model(name, {"lora": {"r": 4}}, spec)
    for module_name, module in model.named_modules():
        attention = module_name.endswith(("attn.attn_dropout", "attention.self.dropout"))
        if isinstance(module, nn.Dropout) and not (dropout or (attention_dropout_only and attention)):
            module.p = 0.0
    return model


def client_data(kind: str, sizes=SIZES, rng_seed: int = 0) -> list[ClientData]:
    """Token rows right-padded to different lengths; client 1's rows are the shortest (1 to 4
    tokens), so its batches are mostly padding."""
    rng = np.random.default_rng(rng_seed)
    out = []
    for i, n in enumerate(sizes):
        x = rng.integers(1, 50, (n, 12))
        for row, length in zip(x, rng.integers(1, 5 if i == 1 else 13, n), strict=True):
            row[length:] = PAD
        arrays = {"x": x} if kind == "causal_lm" else {"x": x, "y": rng.integers(0, 3, n)}
        out.append(ClientData(arrays))
    return out


def vectorized(kind: str, datas, seeds, **model_options):
    spec = MODELS[kind][1]
    return train_local_vectorized(lora_model(kind, **model_options), datas, CONFIG, seeds=seeds, spec=spec)


@pytest.mark.parametrize("kind", MODELS)
def test_a_lora_chunk_trains_as_each_client_alone(kind):
    datas = client_data(kind)
    stacked, metrics, _ = vectorized(kind, datas, SEEDS)
    for i, data in enumerate(datas):
        alone = lora_model(kind)
        expected = train_local(alone, data, CONFIG, seed=SEEDS[i], spec=MODELS[kind][1])
        trained = P.model_params(alone)
        assert set(trained) == set(stacked) and all("lora_" in k or "classifier" in k for k in trained)
        for key, value in trained.items():
            torch.testing.assert_close(stacked[key][i], value, rtol=1e-5, atol=1e-6, msg=f"client {i} {key}")
        assert metrics[i] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "kind, options", [("causal_lm", {"attention_dropout_only": True}), ("classifier", {"dropout": True})]
)
def test_dropout_masks_are_each_clients_own_in_any_chunk(kind, options):
    """Clients 0 and 1 hold the same single row (one batch: no shuffling) under other seeds:
    their masks differ; each trains in the chunk of four as in a chunk of its own."""
    datas = client_data(kind, sizes=(1, 3, 6), rng_seed=1)
    datas = [datas[0], *datas]
    seeds = (21, 22, 23, 24)
    together, _, _ = vectorized(kind, datas, seeds, **options)
    for i, (data, seed) in enumerate(zip(datas, seeds, strict=True)):
        alone, _, _ = vectorized(kind, [data], [seed], **options)
        for key, value in alone.items():
            torch.testing.assert_close(together[key][i], value[0], rtol=1e-5, atol=1e-6)
    differ = [not torch.allclose(together[k][0], together[k][1]) for k in together]
    assert any(differ)
    without, _, _ = vectorized(kind, datas[:1], seeds[:1])  # and the masks drop something
    assert any(not torch.allclose(together[k][0], without[k][0]) for k in together)


def test_attention_dropout_without_a_dropout_layer_is_refused_naming_the_module():
    """Llama draws its attention dropout from a float; no nn.Dropout can hash it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=12, attention_dropout=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = HFTokenModel(LlamaForCausalLM(config), PAD)
    blocker = vectorization_blocker(model, torch.randint(1, 50, (2, 12)))
    assert blocker is not None and "LlamaAttention applies attention dropout 0.1" in blocker
    for layer in model.hf.model.layers:
        layer.self_attn.attention_dropout = 0.0
    assert vectorization_blocker(model, torch.randint(1, 50, (2, 12))) is None


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap's per-client fallback on the CPU
def test_the_fused_kernel_without_dropout_trains_as_each_client_alone(monkeypatch):
    """Without attention dropout a GPU attends through SDPA's fused kernel; forced here on the CPU
    (where vmap runs it once per client), it must train each client as the sequential loop does."""
    from raysim.train import vmap_attention

    calls = []
    monkeypatch.setattr(vmap_attention, "fused_attention", lambda query: calls.append(1) or True)
    datas = client_data("causal_lm")
    stacked, _, _ = vectorized("causal_lm", datas, SEEDS)
    assert calls  # the fused branch ran
    for i, data in enumerate(datas):
        alone = lora_model("causal_lm")
        train_local(alone, data, CONFIG, seed=SEEDS[i], spec=LM)
        for key, value in P.model_params(alone).items():
            torch.testing.assert_close(stacked[key][i], value, rtol=1e-5, atol=1e-6, msg=f"client {i} {key}")
