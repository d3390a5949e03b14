"""HuggingFace transformers for token inputs, built from a config or from a local directory.

Nothing is ever fetched from the hub: models are built with ``from_config`` from a preset size, or
loaded from ``pretrained_path`` with ``local_files_only=True``. ``transformers`` is imported inside
the factories because importing it takes about 6 s. Both models wrap the HF model in
``HFTokenModel``, whose ``forward(x)`` takes token ids (B, T) and whose ``.hf`` attribute is the
inner model; with a ``lora`` section it is the ``peft.PeftModel`` around it (see ``lora.py``).

Anatomy (``anatomy.py``), LoRA or not: ``features(x)`` is the final hidden state that the HF
model's own head reads, and ``head`` that head, so that ``model(x) == model.head(model.features(x))``:

- BERT: the pooler's output (B, D); head = dropout and ``classifier``.
- RoBERTa, DistilBERT: the first token's last hidden state (B, D); head = the classification
  head (RoBERTa's dense-tanh-projection, DistilBERT's ``pre_classifier``, ReLU and ``classifier``).
- GPT-2, Llama: the last hidden state (B, T, D) after the final norm; head = ``lm_head``, which
  the presets tie to the token embedding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from pydantic import BaseModel, PositiveInt
from torch import nn

from raysim.errors import ConfigError
from raysim.models.lora import ClassifierLoraConfig, LoraConfig, apply_lora
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec, Task

if TYPE_CHECKING:
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        PretrainedConfig,
        PreTrainedModel,
    )


@dataclass(frozen=True)
class Sizes:
    """Transformer dimensions; ``intermediate_size`` None means the architecture's usual width."""

    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int | None = None


CLASSIFIER_PRESETS = {
    "tiny": Sizes(2, 64, 2, 128),
    "small": Sizes(4, 256, 4, 1024),
    "base": Sizes(12, 768, 12, 3072),  # BERT-base / RoBERTa-base
}
# "350m" and "1.5b" stand in for FedFish's unspecified LMs (arXiv:2311.10291): GPT-2 medium and XL.
CAUSAL_LM_PRESETS = {
    "tiny": Sizes(2, 64, 2),
    "small": Sizes(4, 256, 4),
    "350m": Sizes(24, 1024, 16),
    "1.5b": Sizes(48, 1600, 25),
}
OVERRIDES = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
# transformers' name of each task a sequence classifier serves (its own loss is never used).
PROBLEM_TYPES = {"classification": "single_label_classification", "regression": "regression"}


class HFClassifierConfig(ModelConfig, frozen=True, extra="forbid"):
    """HuggingFace BERT / RoBERTa / DistilBERT sequence classifier, from a preset or a local dir.

    The size fields override the preset's.
    """

    arch: Literal["bert", "roberta", "distilbert"] = "bert"
    preset: Literal["tiny", "small", "base"] = "tiny"
    num_layers: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    num_heads: PositiveInt | None = None
    intermediate_size: PositiveInt | None = None
    max_position_embeddings: PositiveInt | None = None  # default: what the sequence length needs
    vocab_size: PositiveInt | None = None  # the tokenizer's; default 30522 (BERT WordPiece)
    pretrained_path: str | None = None  # a local save_pretrained directory; ignores arch and preset
    lora: ClassifierLoraConfig | None = None  # train LoRA adapters (and the head) only


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


class HFTokenModel(nn.Module):
    """Runs a HuggingFace model on token ids and returns its logits.

    Attributes:
        hf: the inner HuggingFace model, or the ``peft.PeftModel`` around it under LoRA.
        pad_token_id: positions holding this id are masked out of attention; None masks nothing.
        trim_padding: drop the batch's trailing columns of padding before the forward pass
            (classifiers, whose output is per sequence). Masked positions change no other
            position's output, so this only saves work: GLUE rows padded to 512 tokens
            (FedGuCci's truncation length) cost what the batch's longest row costs, as the
            paper's dynamic padding did.
    """

    def __init__(self, hf: nn.Module, pad_token_id: int | None, trim_padding: bool = False) -> None:
        super().__init__()
        self.hf = hf
        self.pad_token_id = pad_token_id
        self.trim_padding = trim_padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Maps token ids (B, T) to logits, (B, C) for classifiers and (B, T, V) for LMs."""
        x = self.trimmed(x)
        return self.hf(input_ids=x, attention_mask=self.attention_mask(x)).logits

    def attention_mask(self, x: torch.Tensor) -> torch.Tensor | None:
        # No mask at all (rather than all ones) keeps HF on its fast causal-SDPA path.
        return None if self.pad_token_id is None else (x != self.pad_token_id).long()

    def trimmed(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` without its trailing all-padding columns, when ``trim_padding`` is on."""
        if not self.trim_padding or self.pad_token_id is None:
            return x
        used = (x != self.pad_token_id).any(0).nonzero()
        return x[:, : int(used[-1]) + 1] if len(used) else x[:, :1]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden state the head reads: (B, D) for classifiers, (B, T, D) for LMs."""
        inner = self.unwrapped()
        anatomy = hf_anatomy(inner)
        x = self.trimmed(x)
        return anatomy.features(inner.base_model(input_ids=x, attention_mask=self.attention_mask(x)))

    @property
    def head(self) -> nn.Module:
        """The HF model's head (built on each access; its parameters are the model's own)."""
        inner = self.unwrapped()
        return hf_anatomy(inner).head(inner)

    def unwrapped(self) -> PreTrainedModel:
        """The transformers model: ``hf`` itself, or the model inside peft's wrapper (LoRA
        layers included, since peft injects them in place)."""
        get_base_model = getattr(self.hf, "get_base_model", None)  # peft's wrapper has it
        return cast("PreTrainedModel", get_base_model() if get_base_model is not None else self.hf)


class FirstToken(nn.Module):
    """Feeds features (B, D) to a head that reads the first token of hidden states (B, T, D)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features.unsqueeze(1))  # the head takes [:, 0] of (B, 1, D): features


@dataclass(frozen=True)
class Anatomy:
    """Where one transformers class splits: its base model's output -> features; model -> head."""

    features: Callable[[Any], torch.Tensor]
    head: Callable[[Any], nn.Module]


def first_token(output: Any) -> torch.Tensor:
    return output.last_hidden_state[:, 0]  # (B, D)


# Each mirrors the class's forward in transformers 5 (tests check it is bitwise the same).
HF_ANATOMY = {
    "BertForSequenceClassification": Anatomy(
        lambda output: output.pooler_output, lambda hf: nn.Sequential(hf.dropout, hf.classifier)
    ),
    "RobertaForSequenceClassification": Anatomy(first_token, lambda hf: FirstToken(hf.classifier)),
    "DistilBertForSequenceClassification": Anatomy(
        first_token,
        lambda hf: nn.Sequential(hf.pre_classifier, nn.ReLU(), hf.dropout, hf.classifier),
    ),
    "GPT2LMHeadModel": Anatomy(lambda output: output.last_hidden_state, lambda hf: hf.lm_head),
    "LlamaForCausalLM": Anatomy(lambda output: output.last_hidden_state, lambda hf: hf.lm_head),
}


def hf_anatomy(hf: nn.Module) -> Anatomy:
    """How ``hf`` splits into features and head.

    Raises:
        ConfigError: a class (loaded from ``pretrained_path``) whose split is not known.
    """
    anatomy = HF_ANATOMY.get(type(hf).__name__)
    if anatomy is None:
        raise ConfigError(
            [
                f"model: {type(hf).__name__} has no known features and head (the algorithm needs "
                f"them); supported: {', '.join(HF_ANATOMY)}"
            ]
        )
    return anatomy


@register("model", "hf_classifier", config=HFClassifierConfig)
def build_hf_classifier(config: HFClassifierConfig, spec: DataSpec) -> HFTokenModel:
    """HuggingFace BERT / RoBERTa / DistilBERT sequence classifier on token ids.

    For a regression spec (GLUE's STS-B) it is the same model with ``spec.num_classes`` outputs
    (1 for a score) and transformers' regression problem type: (B, num_classes) predictions,
    trained with the mean squared error of ``raysim.train.local.task_loss``.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    sequence_length = token_length(spec, "hf_classifier", ("classification", "regression"))
    if config.pretrained_path is None:
        hf = AutoModelForSequenceClassification.from_config(classifier_hf_config(config, spec))
    else:
        reject_overrides(config, ("vocab_size", "max_position_embeddings"))
        hf_config = AutoConfig.from_pretrained(pretrained_directory(config.pretrained_path))
        # Set apart, problem type first: passed together, transformers checks the saved problem
        # type against the new label count (a saved 2-class classifier could not become a regressor).
        hf_config.problem_type = PROBLEM_TYPES[spec.task]
        hf_config.num_labels = spec.num_classes
        # A saved classifier with another label count gets a fresh head instead of an error.
        hf = load_pretrained(
            AutoModelForSequenceClassification,
            config.pretrained_path,
            config=hf_config,
            ignore_mismatched_sizes=True,
        )
        offset = positions_offset(hf.config.model_type, hf.config.pad_token_id)
        check_positions(hf.config, sequence_length + offset, config.pretrained_path)
    if config.lora is not None:
        hf = apply_lora(hf, config.lora)
    return HFTokenModel(hf, spec.pad_token_id, trim_padding=True)


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


def classifier_hf_config(config: HFClassifierConfig, spec: DataSpec) -> PretrainedConfig:
    """The transformers config of an ``hf_classifier`` built from scratch for ``spec``.

    Raises:
        ValueError: the spec does not fit (task, shape, pad id) or the sizes are inconsistent.
    """
    from transformers import BertConfig, DistilBertConfig, RobertaConfig

    sizes = resolve_sizes(CLASSIFIER_PRESETS[config.preset], config, "hf_classifier")
    vocab_size = config.vocab_size or 30522
    # RoBERTa numbers positions from pad_token_id + 1 and needs a pad id even when there is none.
    pad = 1 if config.arch == "roberta" and spec.pad_token_id is None else spec.pad_token_id
    check_pad(pad, vocab_size, "hf_classifier")
    needed = token_length(spec, "hf_classifier", ("classification", "regression"))
    needed += positions_offset(config.arch, pad)
    positions = config.max_position_embeddings or needed
    if positions < needed:
        raise ValueError(f"model 'hf_classifier': max_position_embeddings {positions} < {needed} needed")
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "max_position_embeddings": positions,
        "pad_token_id": pad,
        "num_labels": spec.num_classes,
        "problem_type": PROBLEM_TYPES[spec.task],
    }
    intermediate = sizes.intermediate_size or 4 * sizes.hidden_size  # BERT's 4d (every preset sets it)
    if config.arch == "distilbert":
        return DistilBertConfig(
            dim=sizes.hidden_size,
            n_layers=sizes.num_layers,
            n_heads=sizes.num_heads,
            hidden_dim=intermediate,
            **common,
        )
    config_class = BertConfig if config.arch == "bert" else RobertaConfig
    return config_class(
        hidden_size=sizes.hidden_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        intermediate_size=intermediate,
        **common,
    )


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


def token_length(spec: DataSpec, model: str, tasks: tuple[Task, ...]) -> int:
    """Returns the sequence length T of a token spec, checking it suits one of ``tasks``.

    Raises:
        ValueError: another task, or an input that is not a 1-D sequence of token ids.
    """
    if spec.task not in tasks:
        raise ValueError(f"model {model!r} serves task {' or '.join(map(repr, tasks))}, not {spec.task!r}")
    if len(spec.input_shape) != 1:
        raise ValueError(f"model {model!r} expects token ids with input_shape (T,), got {spec.input_shape}")
    if spec.num_classes < 1:
        raise ValueError(f"model {model!r} needs num_classes >= 1, got {spec.num_classes}")
    return spec.input_shape[0]


def resolve_sizes(preset: Sizes, config: HFClassifierConfig | HFCausalLMConfig, model: str) -> Sizes:
    """The preset's sizes with the config's overrides applied.

    Raises:
        ValueError: the hidden size is not a multiple of the number of heads.
    """
    sizes = Sizes(**{name: getattr(config, name) or getattr(preset, name) for name in OVERRIDES})
    if sizes.hidden_size % sizes.num_heads:
        raise ValueError(
            f"model {model!r}: hidden_size {sizes.hidden_size} is not a multiple of "
            f"num_heads {sizes.num_heads}"
        )
    return sizes


def positions_offset(model_type: str, pad_token_id: int | None) -> int:
    """Extra position slots an architecture uses: RoBERTa starts counting at pad_token_id + 1."""
    if model_type == "roberta" and pad_token_id is not None:
        return pad_token_id + 1
    return 0


def check_pad(pad_token_id: int | None, vocab_size: int, model: str) -> None:
    """Raises ValueError when the pad id is not a token of the vocabulary."""
    if pad_token_id is not None and not 0 <= pad_token_id < vocab_size:
        raise ValueError(
            f"model {model!r}: pad_token_id {pad_token_id} is outside the vocabulary of {vocab_size} tokens"
        )


def check_positions(hf_config: PretrainedConfig, needed: int, path: str) -> None:
    """Raises ValueError when a loaded model has fewer position embeddings than the data needs."""
    positions = getattr(hf_config, "max_position_embeddings", None)
    if positions is not None and positions < needed:
        raise ValueError(f"{path} has {positions} positions but the data needs {needed}")


def reject_overrides(config: BaseModel, extra_fields: tuple[str, ...]) -> None:
    """Raises ValueError when size options are set next to ``pretrained_path``: they can't apply."""
    fields = [name for name in (*OVERRIDES, *extra_fields) if getattr(config, name) is not None]
    if fields:
        raise ValueError(
            f"options {', '.join(fields)} cannot change a pretrained model; unset them or "
            "unset pretrained_path"
        )


def load_pretrained(
    auto_class: type[AutoModelForCausalLM] | type[AutoModelForSequenceClassification],
    path: str,
    **kwargs: Any,
) -> PreTrainedModel:
    """Loads a model saved with ``save_pretrained`` from a local directory, in float32.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
    """
    directory = pretrained_directory(path)
    # dtype: transformers 5 defaults to "auto", which would keep a bf16 checkpoint in bf16.
    return auto_class.from_pretrained(directory, local_files_only=True, dtype=torch.float32, **kwargs)


def pretrained_directory(path: str) -> Path:
    """``path`` as a directory.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(
            f"pretrained_path {path!r} is not a directory; models load from local "
            "save_pretrained directories only, never from the hub"
        )
    return directory
