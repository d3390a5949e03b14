"""GLUE (Wang et al., ICLR 2019, arXiv:1804.07461): sentence and sentence-pair tasks for a
sequence classifier, STS-B as regression.

FedGuCci (Li et al., KDD 2025, arXiv:2402.18949, Table 3 and Appendix A.5) fine-tunes RoBERTa-base
with LoRA on SST-2, MRPC, CoLA, QNLI, RTE and STS-B, split IID over the clients and scored on the
GLUE dev sets.

Where the rows come from:
    the hub     ``nyu-mll/glue`` with the task as its configuration (``data_files`` unset): needs
                the network once, then the HuggingFace cache serves offline runs
    local files ``data_files: {train: ..., validation: ...}`` in GLUE's column schema (the text
                columns of ``TASKS`` and ``label``), read by the json, csv or parquet builder

What a row becomes: the text, or the pair of texts, encoded by the model's tokenizer as the
model expects (``Tokenizer.encode_inputs``: [CLS] a [SEP] b [SEP] for BERT, <s> a </s></s> b
</s> for RoBERTa), truncated to ``max_length`` tokens (the longer text of a pair first), and
stored unpadded; a client's rows are padded to ``max_length`` with the tokenizer's pad id when
read, and the model masks that id (``DataSpec.pad_token_id``). The train split is partitioned
into clients (IID, equal sizes, by default, as in the paper); the dev split is the central test
set. STS-B's labels are similarity scores in [0, 5]: its spec is
``DataSpec("regression", (max_length,), 1)``, labels float32, one model output, mean squared
error; the others are classification with int64 labels.

Scores beside accuracy (``DataSpec.metrics``, ``raysim.measure.scores``): CoLA the Matthews correlation,
STS-B Pearson's r, MRPC and QQP the F1 of class 1, as GLUE reports them.

Code differences from the FedGuCci paper (its Table 3; App. A.4 says dev sets): the authors' code scored MRPC
on its test split (``test_split: test`` reproduces that; GLUE's other test splits are unlabeled)
and treated STS-B as classification, which cannot have produced its numbers; this recipe uses
the dev sets and regression.

Usage:
    raysim prepare glue task=stsb 'data_files={train: stsb/train.jsonl, validation: stsb/dev.jsonl}' \
        tokenizer.kind=hf tokenizer.name_or_path=./roberta-base
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from raysim.data.hub import load_split
from raysim.data.partition import DirichletPartition, IidPartition, PartitionConfig, ShardsPartition
from raysim.data.store import DatasetConfig, Examples
from raysim.data.text.tokenizer import Tokenizer, TokenizerConfig, load_tokenizer
from raysim.errors import DataError
from raysim.registry import register
from raysim.types import DataSpec

HUB_ID = "nyu-mll/glue"
BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class GlueTask(NamedTuple):
    """One GLUE task: its text columns, its labels (1: a regression score) and its scores."""

    text_columns: tuple[str, ...]
    num_labels: int
    metrics: tuple[str, ...] = ()
    dev_split: str = "validation"


TASKS = {
    "cola": GlueTask(("sentence",), 2, ("mcc",)),
    "sst2": GlueTask(("sentence",), 2),
    "mrpc": GlueTask(("sentence1", "sentence2"), 2, ("f1",)),
    "qqp": GlueTask(("question1", "question2"), 2, ("f1",)),
    "stsb": GlueTask(("sentence1", "sentence2"), 1, ("pearson",)),
    "mnli": GlueTask(("premise", "hypothesis"), 3, (), "validation_matched"),
    "qnli": GlueTask(("question", "sentence"), 2),
    "rte": GlueTask(("sentence1", "sentence2"), 2),
    "wnli": GlueTask(("sentence1", "sentence2"), 2),
}


class GlueConfig(DatasetConfig, frozen=True, extra="forbid"):
    """GLUE recipe settings.

    Attributes:
        task: the GLUE task (the hub configuration's name).
        data_files: split name -> local files (globs allowed); None loads ``nyu-mll/glue`` from
            the hub (or its cache).
        builder: the ``datasets`` builder reading ``data_files``; None: from the file suffix.
        train_split: the split partitioned into clients.
        test_split: the central test set; None: the task's dev split ("validation", MNLI
            "validation_matched").
        label_column: the column of labels (class ids, or STS-B's scores).
        tokenizer: the model's own tokenizer (default RoBERTa-base's from the hub or its
            cache; a local ``save_pretrained`` directory works offline); bpe is not offered:
            it would be trained on the corpus, while GLUE fine-tunes a pretrained model.
        max_length: tokens per row after truncation; the paper truncates at 512.
        max_examples: keep only the first rows of each split (quick runs).
    """

    partition: PartitionConfig = IidPartition(num_clients=20)  # the authors' code default M = 20
    task: Literal["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
    data_files: dict[str, str | list[str]] | None = None
    builder: Literal["json", "csv", "parquet"] | None = None
    train_split: str = "train"
    test_split: str | None = None
    label_column: str = "label"
    tokenizer: TokenizerConfig = TokenizerConfig(kind="hf", name_or_path="FacebookAI/roberta-base")
    max_length: int = Field(128, ge=8)
    max_examples: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> GlueConfig:
        if self.tokenizer.kind == "bpe":
            raise ValueError(
                "tokenizer.kind bpe would train a new vocabulary; GLUE fine-tunes a pretrained "
                "model: use its tokenizer (kind hf) or bytes for models trained from scratch"
            )
        if self.task == "stsb" and isinstance(self.partition, DirichletPartition | ShardsPartition):
            raise ValueError(
                f"partition.kind {self.partition.kind} skews classes, and STS-B is regression "
                "(scores, no classes): use iid"
            )
        if self.data_files is not None:
            missing = [s for s in (self.train_split, self.central_split) if s not in self.data_files]
            if missing:
                raise ValueError(
                    f"data_files has no {' or '.join(map(repr, missing))} split (it has "
                    f"{', '.join(map(repr, self.data_files))}): name the files of each split"
                )
            if self.builder is None:
                self.builder_name()  # raises on an unknown suffix
        return self

    @property
    def central_split(self) -> str:
        """The split scored as the central test set."""
        return self.test_split or TASKS[self.task].dev_split

    def builder_name(self) -> str:
        """The builder for ``data_files``: ``builder``, else the first file's suffix."""
        if self.builder is not None:
            return self.builder
        assert self.data_files is not None
        first = next(iter(self.data_files.values()))
        path = PurePath(first if isinstance(first, str) else first[0])
        suffixes = [s for s in path.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
        builder = BUILDERS.get(suffixes[-1] if suffixes else "")
        if builder is None:
            raise ValueError(
                f"cannot tell the format of {str(path)!r} from its suffix: set builder "
                f"(json, csv or parquet); suffixes known: {', '.join(BUILDERS)}"
            )
        return builder


@register("dataset", "glue")
class Glue:
    """A GLUE task from the hub or local files, tokenized for a sequence classifier."""

    Config = GlueConfig

    def __init__(self, config: GlueConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Tokenizes the train split (the clients' rows) and the dev split (the central test)."""
        cfg, task = self.config, TASKS[self.config.task]
        tokenizer = load_tokenizer(cfg.tokenizer)
        if tokenizer.pad_id is None:
            raise DataError(
                f"tokenizer {tokenizer.name!r} has no pad token distinct from its end token: GLUE "
                "rows are padded to max_length and the model masks the pad id"
            )
        spec = DataSpec(
            "regression" if task.num_labels == 1 else "classification",
            (cfg.max_length,),
            task.num_labels,
            tokenizer.pad_id,
            task.metrics,
        )
        train = self._table(cfg.train_split, tokenizer)
        central = self._table(cfg.central_split, tokenizer)
        return Examples(train, spec, central)

    def _table(self, split: str, tokenizer: Tokenizer) -> pa.Table:
        """One split as columns ``x`` (list<int32> token ids) and ``y``."""
        cfg, task = self.config, TASKS[self.config.task]
        rows = self._load(split)
        texts = [_texts(rows, column, split) for column in task.text_columns]
        ids = tokenizer.encode_inputs(texts[0], texts[1] if len(texts) > 1 else None, cfg.max_length)
        lengths = np.array([len(i) for i in ids], np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = np.concatenate(ids) if ids else np.empty(0, np.int32)
        x = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))
        return pa.table({"x": x, "y": self._labels(rows, split)})

    def _load(self, split: str) -> Any:
        """One split as a ``datasets.Dataset`` with the task's columns, capped at ``max_examples``."""
        cfg = self.config
        if cfg.data_files is None:
            path, name = HUB_ID, cfg.task
        else:
            path, name = cfg.builder_name(), None
        rows = load_split(
            path,
            name,
            split=split,
            data_files=cfg.data_files,
            local_hint="give local files in the GLUE schema (data_files: {train: ..., validation: ...})",
        )
        needed = (*TASKS[cfg.task].text_columns, cfg.label_column)
        missing = [c for c in needed if c not in rows.column_names]
        if missing:
            raise DataError(
                f"GLUE {cfg.task} split {split!r} has no column {', '.join(map(repr, missing))} "
                f"(columns: {', '.join(rows.column_names)}); {cfg.task} needs {', '.join(needed)}"
            )
        if cfg.max_examples is not None and len(rows) > cfg.max_examples:
            rows = rows.select(range(cfg.max_examples))
        return rows

    def _labels(self, rows: Any, split: str) -> pa.Array:
        """float32 scores for STS-B, else int64 class ids in [0, num_labels)."""
        cfg, task = self.config, TASKS[self.config.task]
        labels = np.asarray(list(rows[cfg.label_column]))
        if labels.dtype == object or not np.issubdtype(labels.dtype, np.number):
            raise DataError(f"GLUE {cfg.task} split {split!r}: column {cfg.label_column!r} is not numeric")
        if task.num_labels == 1:
            scores = labels.astype(np.float32)
            if not np.isfinite(scores).all():
                raise DataError(f"GLUE {cfg.task} split {split!r}: a label is not a finite number")
            return pa.array(scores)
        if (labels < 0).any():
            raise DataError(
                f"GLUE {cfg.task} split {split!r} holds unlabeled rows (label -1): GLUE hides its "
                "test labels; score on the dev split (test_split: validation)"
            )
        classes = labels.astype(np.int64)
        if (classes != labels).any() or (classes >= task.num_labels).any():
            raise DataError(
                f"GLUE {cfg.task} split {split!r}: labels must be class ids 0..{task.num_labels - 1}"
            )
        return pa.array(classes)


def _texts(rows: Any, column: str, split: str) -> list[str]:
    texts = list(rows[column])
    missing = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if missing:
        raise DataError(f"split {split!r}: column {column!r} has no text in row {missing[0]}")
    return texts
