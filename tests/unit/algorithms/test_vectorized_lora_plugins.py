"""Batched LoRA cohorts through the plugins: on the tiny GPT-2 LoRA language model (dropout off),
``vectorized_update`` returns what ``client_update`` returns client by client for FedAvg, FedProx,
FedAdam's clients and FedFish (its extra Fisher pass, and the last epoch's squared gradients)."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import context, payload
from test_vectorized_update import assert_same_results, plugin
from torch import nn

from raysim import params as P
from raysim.models import build_model
from raysim.types import ClientData, DataSpec, Payload

LM = DataSpec("causal_lm", (10,), 40, pad_token_id=0)
SIZES = (3, 1, 5)  # batches of 2: a short last batch, unequal batch counts


def lora_lm() -> nn.Module:
    torch.manual_seed(0)
    model = build_model("hf_causal_lm", {"lora": {"r": 4}}, LM)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # the sequential loop's masks are not the hashed ones
    return model


def lm_contexts():
    """Three clients of right-padded token rows of different lengths, the LM as the broadcast."""
    broadcast = P.clone(P.model_params(lora_lm()))
    rng = np.random.default_rng(5)
    out = []
    for i, n in enumerate(SIZES):
        x = rng.integers(1, 40, (n, 10))
        for row, length in zip(x, rng.integers(2, 11, n), strict=True):
            row[length:] = 0
        ctx = context(np.zeros((n, 2)), np.zeros(n), payload(), client_id=i)
        sent = Payload({k: v.numpy() for k, v in broadcast.items()}, None)
        data = ClientData({"x": x})
        out.append(
            replace(
                ctx, model=lora_lm(), payload=sent, global_params=broadcast, data=data, spec=LM, seed=50 + i
            )
        )
    return out


@pytest.mark.parametrize(
    "name, options",
    [
        ("fedavg", {"local": {"lr": 0.1, "batch_size": 2, "epochs": 2, "momentum": 0.9}}),
        ("fedprox", {"mu": 0.5, "local": {"lr": 0.1, "batch_size": 2, "epochs": 2}}),
        ("fedadam", {"local": {"lr": 0.1, "batch_size": 2}}),
        ("fedfish", {"local": {"lr": 0.1, "batch_size": 2}, "fisher_mode": "eval", "fisher_reduce": "mean"}),
        ("fedfish", {"local": {"lr": 0.1, "batch_size": 2, "epochs": 2}, "fisher_source": "last_epoch"}),
    ],
)
def test_lora_lm_clients_vectorized_match_client_update(name, options):
    algo = plugin(name, **options)
    sequential = [algo.client_update(ctx) for ctx in lm_contexts()]
    assert_same_results(algo.vectorized_update(lm_contexts()), sequential, rtol=1e-5, atol=1e-6)
