"""Python's own help topics as a federated text corpus: 79 topics, one client each, offline.

``pydoc_data.topics.topics`` ships with CPython: 79 help texts (about 465k characters of
English, from "assert" to "with") that ``help()`` shows. Each topic is one document and one
natural client; topics too short for ``min_sequences`` packed sequences are dropped. Built by the
same streaming writer as C4 (``raysim.data.text.writer``), with a bpe tokenizer trained on the topics
by default: the offline language-model demo's dataset.

Usage:
    store = open_dataset("pydoc_topics", PydocTopicsConfig())
    store.client_key(0), store.client_data(0).arrays["x"].shape      # "assert", (n, 64)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from raysim.data.text.recipes import TextDatasetConfig
from raysim.data.text.spill import Document
from raysim.data.text.writer import write_text_store
from raysim.registry import register


class PydocTopicsConfig(TextDatasetConfig, frozen=True, extra="forbid"):
    """pydoc topics settings: ``TextDatasetConfig`` with defaults sized for 465k characters."""

    seq_len: int = Field(64, ge=2)
    num_buckets: int = Field(4, ge=1, le=65_536)


@register("dataset", "pydoc_topics")
class PydocTopics:
    """CPython's 79 pydoc help topics (English text shipped offline), one client per topic."""

    Config = PydocTopicsConfig

    def __init__(self, config: PydocTopicsConfig) -> None:
        self.config = config

    def documents(self) -> Iterator[Document]:
        """(topic, paragraph) for every paragraph of every topic, in sorted order.

        Paragraphs are the documents, so a split by document keeps whole paragraphs on one side.
        """
        from pydoc_data.topics import topics

        for topic in sorted(topics):
            for paragraph in topics[topic].split("\n\n"):
                if paragraph.strip():
                    yield topic, paragraph

    def write_store(self, path: Path, source: dict[str, Any]) -> None:
        """Writes the store in ``path``."""
        write_text_store(self.documents(), self.config, path, source=source)
