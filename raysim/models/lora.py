"""LoRA adapters on HuggingFace text and image models, through peft (Hu et al., arXiv:2106.09685).

With a ``lora`` section, the base model is frozen and only the adapters train (plus, for a
classifier with ``train_head``, its head, and with ``bias`` "all" or "lora_only", biases).
``raysim.params.model_params`` sends trainable tensors only, so clients and server exchange
those and the frozen base never leaves a worker.

Every process builds the same adapters: the engine seeds torch before building the model, the
base is built first, and peft then draws ``lora_A`` from the same global generator (``lora_B``
starts at zero, so a fresh adapter leaves the base model's output unchanged).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, PositiveInt
from torch import nn

from raysim.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Attention projections, as in the LoRA paper; GPT-2's "c_proj" also matches its MLP output.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "gpt2": ["c_attn", "c_proj"],
    "llama": ["q_proj", "v_proj"],
    "bert": ["query", "value"],
    "roberta": ["query", "value"],
    "distilbert": ["q_lin", "v_lin"],
    "vit": ["q_proj", "v_proj"],  # transformers 5 names (4 had "query", "value")
    # ResNet has no attention: every convolution (stem, blocks, shortcuts) gets a low-rank conv.
    "resnet": ["convolution"],
}


class LoraConfig(BaseModel, frozen=True, extra="forbid"):
    """LoRA on a causal LM: ``W x + (alpha / r) * B A x`` on every targeted layer.

    ``target_modules`` holds module names matched as peft does (the full name or its last
    parts, e.g. "c_attn" matches "transformer.h.0.attn.c_attn"); None takes the architecture's
    default (``DEFAULT_TARGETS``, else peft's own table). ``bias`` is peft's: "none" keeps every
    bias frozen, "all" trains (and sends) every bias of the model, "lora_only" those of the
    adapted layers. FedGuCci's GLUE runs use ``bias="all"`` (the FedGuCci authors' code).
    """

    r: PositiveInt = 8
    alpha: PositiveInt = 16
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | None = Field(None, min_length=1)
    bias: Literal["none", "all", "lora_only"] = "none"


class ClassifierLoraConfig(LoraConfig, frozen=True, extra="forbid"):
    """LoRA on a sequence classifier; ``train_head`` also trains (and sends) the fresh head."""

    train_head: bool = True


def apply_lora(hf: PreTrainedModel, config: LoraConfig) -> nn.Module:
    """Freezes ``hf`` and adds LoRA adapters; returns the ``peft.PeftModel`` around it.

    The returned model takes the same keyword arguments as ``hf`` and exposes its ``config``.

    Raises:
        ConfigError: a target module name matches no adapter-capable layer (the message lists
            the names that do), or the architecture has no default targets.
    """
    import peft

    head = head_modules(hf) if isinstance(config, ClassifierLoraConfig) and config.train_head else []
    targets = resolve_targets(hf, config.target_modules, head)
    peft_config = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets,
        modules_to_save=head or None,
        bias=config.bias,
        # GPT-2's Conv1D stores weights as (in, out); peft would guess this with a warning.
        fan_in_fan_out=hf.config.model_type == "gpt2",
    )
    with warnings.catch_warnings():
        # peft 0.21 calls a transformers 5 method that warns of its rename; every worker would print it.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return peft.get_peft_model(hf, peft_config)


def head_modules(hf: PreTrainedModel) -> list[str]:
    """The classifier's own top-level modules with weights: everything but the encoder."""
    return [
        name
        for name, child in hf.named_children()
        if name != hf.base_model_prefix and any(True for _ in child.parameters())
    ]


def resolve_targets(hf: PreTrainedModel, targets: list[str] | None, head: list[str]) -> list[str]:
    """The module names to adapt, checked against ``hf`` before peft sees them.

    A name is valid when it matches at least one layer outside the head, and every layer it
    matches is one LoRA can adapt (Linear, GPT-2's Conv1D, Embedding, Conv2d).

    Raises:
        ConfigError: listing the invalid names and the valid ones.
    """
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    from transformers.pytorch_utils import Conv1D

    model_type = hf.config.model_type
    adaptable = (nn.Linear, nn.Embedding, Conv1D, nn.Conv2d)
    modules = [
        (name, module)
        for name, module in hf.named_modules()
        if name and not any(name == h or name.startswith(f"{h}.") for h in head)
    ]
    available = sorted({name.rsplit(".", 1)[-1] for name, m in modules if isinstance(m, adaptable)})
    if targets is None:
        defaults: Sequence[str] | None = DEFAULT_TARGETS.get(model_type)
        defaults = defaults or TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
        if not defaults:
            raise ConfigError(
                [
                    f"model.lora.target_modules: no default for architecture {model_type!r}; "
                    f"name some of {available}"
                ]
            )
        return list(defaults)
    bad = []
    for target in targets:
        matched = [m for name, m in modules if name == target or name.endswith(f".{target}")]
        if not matched or not all(isinstance(m, adaptable) for m in matched):
            bad.append(target)
    if bad:
        trained_whole = f" (the head {head} trains whole, as train_head asks)" if head else ""
        raise ConfigError(
            [
                f"model.lora.target_modules: {bad} name no Linear, Conv1D, Embedding or Conv2d layer of "
                f"this {model_type!r} model; choose from {available}{trained_whole}"
            ]
        )
    return list(targets)
