"""``hf_classifier``: a HuggingFace BERT / RoBERTa / DistilBERT sequence classifier on token ids.

Built from a preset size or loaded from a local ``pretrained_path``; the wrapper, the anatomy and
the checks it shares with ``hf_causal_lm`` are in ``text.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import PositiveInt

from raysim.models.lora import ClassifierLoraConfig, apply_lora
from raysim.models.text import (
    HFTokenModel,
    Sizes,
    check_pad,
    check_positions,
    load_pretrained,
    pretrained_directory,
    reject_overrides,
    resolve_sizes,
    token_length,
)
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig


CLASSIFIER_PRESETS = {
    "tiny": Sizes(2, 64, 2, 128),
    "small": Sizes(4, 256, 4, 1024),
    "base": Sizes(12, 768, 12, 3072),  # BERT-base / RoBERTa-base
}
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


@register("model", "hf_classifier", config=HFClassifierConfig)
def build_hf_classifier(config: HFClassifierConfig, spec: DataSpec) -> HFTokenModel:
    """HuggingFace BERT / RoBERTa / DistilBERT sequence classifier on token ids.

    For a regression spec (GLUE's STS-B) it is the same model with ``spec.num_classes`` outputs
    (1 for a score) and transformers' regression problem type: (B, num_classes) predictions,
    trained with the mean squared error of ``raysim.train.task_loss.task_loss``.
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


def positions_offset(model_type: str, pad_token_id: int | None) -> int:
    """Extra position slots an architecture uses: RoBERTa starts counting at pad_token_id + 1."""
    if model_type == "roberta" and pad_token_id is not None:
        return pad_token_id + 1
    return 0
