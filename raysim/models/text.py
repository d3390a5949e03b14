"""HuggingFace transformers for token inputs: the wrapper, anatomy and checks both text models share.

The models are ``hf_classifier`` (``hf_classifier.py``) and ``hf_causal_lm`` (``hf_causal_lm.py``),
built from a config or from a local directory. Nothing is ever fetched from the hub: models are
built with ``from_config`` from a preset size, or loaded from ``pretrained_path`` with
``local_files_only=True``. ``transformers`` is imported inside the factories because importing it
takes about 6 s. Both models wrap the HF model in ``HFTokenModel``, whose ``forward(x)`` takes
token ids (B, T) and whose ``.hf`` attribute is the inner model; with a ``lora`` section it is the
``peft.PeftModel`` around it (see ``lora.py``).

Anatomy (``anatomy.py``), LoRA or not: ``features(x)`` is the final hidden state that the HF
model's own head reads, and ``head`` that head, so that ``model(x) == model.head(model.features(x))``:

- BERT: the pooler's output (B, D); head = dropout and ``classifier``.
- RoBERTa, DistilBERT: the first token's last hidden state (B, D); head = the classification
  head (RoBERTa's dense-tanh-projection, DistilBERT's ``pre_classifier``, ReLU and ``classifier``).
- GPT-2, Llama: the last hidden state (B, T, D) after the final norm; head = ``lm_head``, which
  the presets tie to the token embedding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from pydantic import BaseModel
from torch import nn

from raysim.errors import ConfigError
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


OVERRIDES = ("num_layers", "hidden_size", "num_heads", "intermediate_size")


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
        """``x`` without its trailing all-padding columns, when ``trim_padding`` is on. Under a
        ``torch.func`` transform (``vmap``: one client of a chunk) ``x`` stays whole, as a shape
        cannot depend on the data there; the vectorized trainer trims the chunk's batch before."""
        under_transform = torch._C._functorch.maybe_current_level() is not None
        if not self.trim_padding or self.pad_token_id is None or under_transform:
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


def resolve_sizes(preset: Sizes, config: BaseModel, model: str) -> Sizes:
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
