"""C4 grouped by URL host: one client per web host, as FedFish's federated C4.

FedFish (Dhawan et al., arXiv:2311.10291) trains on C4 split by domain with Dataset Grouper
(Charles et al., arXiv:2307.09619), whose key is the URL's network location. Here the key is
``urllib.parse.urlsplit(url).hostname``: the full host, lower-cased, without port or user, so
``www.nytimes.com`` and ``nytimes.com`` stay two clients (no eTLD+1 merging, as in Dataset
Grouper). Unlike its raw ``netloc`` the key drops a port or user and is lower-cased, so client counts
can differ slightly from the paper's 15.6M.
Documents whose ``url`` has no host are skipped and counted (``num_skipped_documents`` in the
store's meta.json). Clients are sorted by host; packing and the split are described in
``raysim.data.text.writer``; there is no central test set (FedFish evaluates held-out clients,
built from C4's validation split: ``split=validation``).

The corpus streams through ``datasets.load_dataset(..., streaming=True)`` into the bounded-memory
writer, from the hub ("allenai/c4", config "en") or from local JSON-lines files in C4's schema
``{text, timestamp, url}`` (``data_files``; .json or .json.gz, globs allowed).

Usage:
    raysim prepare c4 data_files='/data/c4/c4-train.*.json.gz' seq_len=1024 num_buckets=1024
    store = open_dataset("c4", C4Config(data_files="c4-sample.json", seq_len=128))
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from raysim.data.text.recipes import TextDatasetConfig, hf_records
from raysim.data.text.spill import Document
from raysim.data.text.writer import write_text_store
from raysim.registry import register


class C4Config(TextDatasetConfig, frozen=True, extra="forbid"):
    """C4 recipe settings (packing, tokenizer and memory settings: ``TextDatasetConfig``).

    Attributes:
        path: hub id passed to ``datasets.load_dataset``; unused when ``data_files`` is set.
        subset: the C4 variant ("en", "en.noclean", "realnewslike", ...); unused with data_files
            (HF calls it the config name; `name:` in a job picks the recipe).
        data_files: local JSON-lines files in C4's schema, read with the ``json`` builder.
        split: "train" or "validation" (with data_files: the split they are filed under).
        streaming: stream the corpus (never downloaded whole); False reads a map-style dataset.
        max_documents: read only the first documents (quick builds); None reads all.
    """

    path: str = "allenai/c4"
    subset: str | None = "en"
    data_files: str | list[str] | dict[str, str | list[str]] | None = None
    split: str = "train"
    streaming: bool = True
    max_documents: int | None = Field(None, ge=1)


def url_host(url: Any) -> str | None:
    """The lower-case host of ``url``, or None when it has none (or is not text)."""
    if not isinstance(url, str):
        return None
    try:
        return urllib.parse.urlsplit(url.strip()).hostname or None
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return None


@register("dataset", "c4")
class C4:
    """C4 (allenai/c4 or local JSON lines) grouped by URL host: one client per host."""

    Config = C4Config

    def __init__(self, config: C4Config) -> None:
        self.config = config

    def documents(self) -> Iterator[Document]:
        """(host, text) of every document, in corpus order."""
        cfg = self.config
        path, name = ("json", None) if cfg.data_files is not None else (cfg.path, cfg.subset)
        records = hf_records(
            path,
            name,
            split=cfg.split,
            data_files=cfg.data_files,
            streaming=cfg.streaming,
            columns=("text", "url"),
            max_records=cfg.max_documents,
            local_hint="give data_files: local JSON-lines files in C4's schema {text, timestamp, url}",
        )
        for record in records:
            yield url_host(record["url"]), record["text"] or ""

    def write_store(self, path: Path, source: dict[str, Any]) -> None:
        """Streams the corpus into a client store in ``path`` (resumes an interrupted build)."""
        write_text_store(self.documents(), self.config, path, source=source)
