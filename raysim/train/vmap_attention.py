"""HuggingFace attention that trains vectorized: ``vmap`` batches it, its dropout is per client.

transformers' attention paths do not run under ``torch.func.vmap`` for a chunk of clients: the
SDPA mask asks whether a batch holds padding (a branch on the data), and every path draws
attention dropout inside the function (``dropout_p``), one stream for the whole chunk, out of
``raysim.train.hashed_dropout``'s reach. While ``vmap_attention(model)`` is active, every
transformers model inside ``model`` computes attention eagerly: scores, transformers' additive
eager mask (always built: no branch on the data), softmax, the attention module's own
``nn.Dropout`` (which ``HashedDropout`` replaces: each client's masks from its seed), values.
The same function as SDPA up to float rounding; it holds the (T x T) scores of every head for
the backward, as SDPA's math path does. Without attention dropout (eval mode, FedFish's Fisher
pass, a model whose attention dropout is 0) on a GPU, SDPA's fused kernel runs instead, with the
same always-built mask.

Usage:
    with vmap_attention(model):
        ...  # vmap(grad(functional_call(model, ...)))
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NAME = "raysim_vmap"
# The attention modules' dropout layers by name: GPT-2's, then BERT's, RoBERTa's and DistilBERT's.
DROPOUT_NAMES = ("attn_dropout", "dropout")


def vmap_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention interface: (B, H, T, D) query, key and value (key and value may
    hold fewer heads, shared by groups of query heads) -> output (B, T, H, D) and the weights
    (None from the fused kernel)."""
    if key.shape[1] != query.shape[1]:  # grouped-query attention
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    mask = None if attention_mask is None else attention_mask[..., : key.shape[-2]]
    if dropout == 0 and fused_attention(query):  # no mask to draw: the fused kernel, batched by vmap
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).contiguous(), None
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    weights = scores.softmax(-1, dtype=torch.float32).to(value.dtype)
    if dropout > 0:
        weights = _dropout_layer(module, dropout)(weights)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def fused_attention(query: torch.Tensor) -> bool:
    """Whether attention without dropout takes SDPA's fused kernel: on a GPU, where ``vmap`` has
    batching rules for its memory-efficient and flash kernels (no T x T scores kept); on the CPU
    it has none and would run the kernel once per client, so the eager products are used."""
    return query.is_cuda


def _dropout_layer(module: nn.Module, rate: float) -> nn.Module:
    """The attention module's ``nn.Dropout`` of ``rate``, which ``HashedDropout`` can replace."""
    for name in DROPOUT_NAMES:
        layer = getattr(module, name, None)
        if type(layer) is nn.Dropout and layer.p == rate:
            return layer
    raise ValueError(
        f"{type(module).__name__} applies attention dropout {rate} without an nn.Dropout layer "
        "(per-client masks need one); set the model's attention dropout to 0"
    )


def vmap_attention_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' eager mask, never skipped: whether a mask could be (no padding in the batch)
    is a branch on the data, which ``vmap`` cannot take."""
    from transformers.masking_utils import eager_mask

    return eager_mask(**kwargs | {"allow_is_bidirectional_skip": False})


def _register() -> None:
    """Adds the attention and its mask to transformers' tables, once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, vmap_attention_forward)
        AttentionMaskInterface.register(NAME, vmap_attention_mask)


@contextmanager
def vmap_attention(model: nn.Module) -> Iterator[None]:
    """Every transformers model inside ``model`` attends through ``vmap_attention_forward`` while
    active; each its own implementation again afterwards, also on an error."""
    if "transformers" not in sys.modules:  # no transformers model can exist
        yield
        return
    from transformers import PretrainedConfig

    configs = {
        id(config): config
        for module in model.modules()
        if isinstance(config := getattr(module, "config", None), PretrainedConfig)
    }
    if not configs:
        yield
        return
    _register()
    saved = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation = NAME
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = saved[key]
