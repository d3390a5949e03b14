"""``hf_causal_lm``: a HuggingFace decoder-only LM (GPT-2 or Llama) on token ids.

Built from a preset size or loaded from a local ``pretrained_path``; the wrapper, the anatomy and
the checks it shares with ``hf_classifier`` are in ``text.py``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import PositiveInt

from raysim.models.lora import LoraConfig, apply_lora
from raysim.models.text import (
    HFTokenModel,
    Sizes,
    check_pad,
    check_positions,
    load_pretrained,
    reject_overrides,
    resolve_sizes,
    token_length,
)
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig


# "350m" and "1.5b" stand in for FedFish's unspecified LMs (arXiv:2311.10291): GPT-2 medium and XL.
CAUSAL_LM_PRESETS = {
    "tiny": Sizes(2, 64, 2),
    "small": Sizes(4, 256, 4),
    "350m": Sizes(24, 1024, 16),
    "1.5b": Sizes(48, 1600, 25),
}


class HFCausalLMConfig(ModelConfig, frozen=True, extra="forbid"):
    """HuggingFace decoder-only LM (GPT-2 or Llama), from a preset or a local directory.

    The size fields override the preset's.
    """

    arch: Literal["gpt2", "llama"] = "gpt2"
    preset: Literal["tiny", "small", "350m", "1.5b"] = "tiny"
    num_layers: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    num_heads: PositiveInt | None = None
    intermediate_size: PositiveInt | None = None  # default 4d (gpt2), about 8d/3 (llama, SwiGLU)
    max_positions: PositiveInt | None = None  # default: the sequence length
    pretrained_path: str | None = None  # a local save_pretrained directory; ignores arch and preset
    lora: LoraConfig | None = None  # train LoRA adapters only; the base stays frozen


@register("model", "hf_causal_lm", config=HFCausalLMConfig)
def build_hf_causal_lm(config: HFCausalLMConfig, spec: DataSpec) -> HFTokenModel:
    """HuggingFace decoder-only LM (GPT-2 or Llama): tokens (B, T) -> logits (B, T, vocab)."""
    from transformers import AutoModelForCausalLM

    sequence_length = token_length(spec, "hf_causal_lm", ("causal_lm",))
    if config.pretrained_path is None:
        hf = AutoModelForCausalLM.from_config(causal_lm_hf_config(config, spec))
    else:
        reject_overrides(config, ("max_positions",))
        hf = load_pretrained(AutoModelForCausalLM, config.pretrained_path)
        check_positions(hf.config, sequence_length, config.pretrained_path)
        vocab = hf.get_output_embeddings().weight.shape[0]
        if vocab != spec.num_classes:
            raise ValueError(
                f"model 'hf_causal_lm': {config.pretrained_path} has a vocabulary of {vocab} "
                f"tokens but the data's is {spec.num_classes}"
            )
    # The key/value cache only serves generation; in training it would hold memory for nothing.
    hf.config.use_cache = False
    if config.lora is not None:
        hf = apply_lora(hf, config.lora)
    return HFTokenModel(hf, spec.pad_token_id)


def causal_lm_hf_config(config: HFCausalLMConfig, spec: DataSpec) -> PretrainedConfig:
    """The transformers config of an ``hf_causal_lm`` built from scratch for ``spec``.

    Beginning/end-of-sequence ids are left unset: they belong to the tokenizer, and the
    simulator never generates text.

    Raises:
        ValueError: the spec does not fit (task, shape, pad id) or the sizes are inconsistent.
    """
    from transformers import GPT2Config, LlamaConfig

    sizes = resolve_sizes(CAUSAL_LM_PRESETS[config.preset], config, "hf_causal_lm")
    sequence_length = token_length(spec, "hf_causal_lm", ("causal_lm",))
    positions = config.max_positions or sequence_length
    if positions < sequence_length:
        raise ValueError(f"model 'hf_causal_lm': max_positions {positions} < {sequence_length}")
    check_pad(spec.pad_token_id, spec.num_classes, "hf_causal_lm")
    common: dict[str, Any] = {
        "vocab_size": spec.num_classes,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if config.arch == "gpt2":
        return GPT2Config(
            n_layer=sizes.num_layers,
            n_embd=sizes.hidden_size,
            n_head=sizes.num_heads,
            n_inner=sizes.intermediate_size,
            n_positions=positions,
            **common,
        )
    # SwiGLU has three d x d_ff matrices: d_ff ~ 8d/3 matches GPT-2's two of 4d in parameters.
    intermediate = sizes.intermediate_size or 64 * math.ceil(8 * sizes.hidden_size / 3 / 64)
    # Tied embeddings keep the parameter count in GPT-2's class, as the presets promise.
    return LlamaConfig(
        num_hidden_layers=sizes.num_layers,
        hidden_size=sizes.hidden_size,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_heads,
        intermediate_size=intermediate,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
        **common,
    )
