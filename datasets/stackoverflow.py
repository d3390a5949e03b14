"""Stack Overflow by user, from local JSON-lines files: one client per user.

FedFish (arXiv:2311.10291) trains its 350M LM on TFF's Stack Overflow, where every client is one
user's questions and answers. TFF ships it as per-user SQLite/HDF5; export it (or a Stack
Exchange dump) to JSON lines with one post per line, e.g.
``{"user_id": "4211", "title": "How do I ...", "tokens": "i have a list ..."}``.
Each post is one document: its ``text_columns`` joined by newlines (list values, such as token
lists, joined by spaces; missing or null values are empty). Posts without a user are skipped and
counted. Clients are sorted by user id (as text); packing and the split: ``raysim.data.text.writer``.

Usage:
    raysim prepare stackoverflow data_files=/data/so/train.jsonl user_column=OwnerUserId \
        'text_columns=[Title, Body]'
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from raysim.data.text.recipes import TextDatasetConfig, hf_records
from raysim.data.text.spill import Document
from raysim.data.text.writer import write_text_store
from raysim.registry import register


class StackOverflowConfig(TextDatasetConfig, frozen=True, extra="forbid"):
    """Stack Overflow recipe settings (packing, tokenizer, memory: ``TextDatasetConfig``).

    Attributes:
        data_files: local JSON-lines files (globs allowed), read with the ``json`` builder.
        split: the split the files are filed under.
        user_column: the column holding the user (author) id: the client key.
        text_columns: columns joined (by newlines) into the post's text.
        max_documents: read only the first posts; None reads all.
    """

    data_files: str | list[str] | dict[str, str | list[str]]
    split: str = "train"
    user_column: str = "user_id"
    text_columns: tuple[str, ...] = Field(("title", "tokens"), min_length=1)
    max_documents: int | None = Field(None, ge=1)


def post_text(record: dict[str, Any], columns: tuple[str, ...]) -> str:
    """The text of one post: its columns joined by newlines; lists joined by spaces."""
    parts = []
    for column in columns:
        value = record.get(column)
        if isinstance(value, list):
            value = " ".join(map(str, value))
        if value is not None and str(value):
            parts.append(str(value))
    return "\n".join(parts)


@register("dataset", "stackoverflow")
class StackOverflow:
    """Stack Overflow posts from local JSON lines, one client per user."""

    Config = StackOverflowConfig

    def __init__(self, config: StackOverflowConfig) -> None:
        self.config = config

    def documents(self) -> Iterator[Document]:
        """(user id, post text) of every post, in file order."""
        cfg = self.config
        records = hf_records(
            "json",
            split=cfg.split,
            data_files=cfg.data_files,
            columns=(cfg.user_column,),
            max_records=cfg.max_documents,
        )
        for record in records:
            user = record[cfg.user_column]
            yield (None if user is None else str(user)), post_text(record, cfg.text_columns)

    def write_store(self, path: Path, source: dict[str, Any]) -> None:
        """Streams the posts into a client store in ``path`` (resumes an interrupted build)."""
        write_text_store(self.documents(), self.config, path, source=source)
