"""What the text recipes in ``datasets/`` share (c4, stackoverflow, pydoc_topics).

``TextDatasetConfig``, the settings of a store built by the streaming writer
(``raysim.data.text.writer``), and ``hf_records``, a lazy reader of HuggingFace datasets
(streaming).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from raysim.data.hub import load_split
from raysim.data.partition import NaturalPartition
from raysim.data.store import DatasetConfig
from raysim.data.text.tokenizer import TokenizerConfig
from raysim.errors import DataError


class TextDatasetConfig(DatasetConfig, frozen=True, extra="forbid"):
    """Settings shared by text recipes built with the streaming writer.

    Attributes:
        partition: clients are always the documents' own keys (hosts, users, topics).
        seq_len: tokens per packed sequence (one example).
        tokenizer: which tokenizer; default a bpe trained on the corpus.
        min_sequences: clients with fewer packed sequences are dropped (counted in meta.json).
        max_sequences: keep at most this many sequences per client, the first in document order
            (counted in meta.json); None keeps all.
        num_buckets: spill buckets; one bucket (about corpus / num_buckets) is held in memory.
        buffer_docs: documents buffered per bucket before a flush to disk.
        checkpoint_docs: documents between two resumable checkpoints of the spill.
    """

    partition: NaturalPartition = NaturalPartition(column="key")
    seq_len: int = Field(128, ge=2)
    tokenizer: TokenizerConfig = TokenizerConfig()
    min_sequences: int = Field(1, ge=1)
    max_sequences: int | None = Field(None, ge=1)
    split_by: Literal["document", "sequence"] = "sequence"  # document: no text on both sides
    num_buckets: int = Field(64, ge=1, le=65_536)
    buffer_docs: int = Field(2_000, ge=1)
    checkpoint_docs: int = Field(500_000, ge=1)
    # The streaming writer splits documents or sequences, not labelled rows: nothing to stratify.
    stratify_test: Literal[False] = Field(False, exclude_if=lambda value: not value)


def hf_records(
    path: str,
    name: str | None = None,
    *,
    split: str = "train",
    data_files: str | list[str] | dict[str, Any] | None = None,
    streaming: bool = True,
    columns: tuple[str, ...] = (),
    max_records: int | None = None,
    local_hint: str = "give local files with data_files",
) -> Iterator[dict]:
    """Records of a HuggingFace dataset split, read lazily (``load_dataset`` runs on first use).

    Args:
        path, name, split, data_files, streaming: as ``datasets.load_dataset`` takes them.
        columns: columns every record must have (checked on the first record).
        max_records: stop after this many records; None reads all.
        local_hint: how to use local files instead of the hub, in the recipe's terms.

    Raises:
        DataError: the dataset cannot be loaded or lacks one of ``columns``.
    """
    dataset = load_split(
        path, name, split=split, data_files=data_files, streaming=streaming, local_hint=local_hint
    )
    try:
        records = iter(dataset)
        first = next(records, None)
    except (OSError, ValueError) as e:  # streaming opens the files only now
        raise DataError(f"cannot read split {split!r} of {path!r}: {type(e).__name__}: {e}") from e
    if first is None:
        return
    missing = [c for c in columns if c not in first]
    if missing:
        raise DataError(
            f"{path} split {split!r} has no column {', '.join(map(repr, missing))} "
            f"(columns: {', '.join(first)})"
        )
    try:
        yield from itertools.islice(itertools.chain([first], records), max_records)
    except (OSError, ValueError) as e:  # a malformed line or a dropped connection, mid-stream
        raise DataError(
            f"reading {path!r} split {split!r} failed part-way: {type(e).__name__}: {e}. "
            "The build keeps what it has; run the same command again to resume"
        ) from e
