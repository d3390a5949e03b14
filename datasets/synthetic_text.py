"""Seeded random text for language-model benchmarks: any number of clients, any length.

Words are random lowercase strings drawn once from ``seed``; each client's text is a stream of
them with Zipf-distributed frequencies (as natural text's are), split into sentences. The store is
built by the same writer as the real corpora (``raysim.data.text.writer``: a bpe tokenizer trained
on the text, sequences packed to ``seq_len``), so a benchmark on it times the real data path. The
same config always gives the same bytes.

Usage:
    store = open_dataset("synthetic_text", SyntheticTextConfig(num_clients=200, seq_len=512))
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, PositiveInt

from raysim.data.text.recipes import TextDatasetConfig
from raysim.data.text.spill import Document
from raysim.data.text.writer import write_text_store
from raysim.registry import register

SENTENCE_WORDS = 12  # words per sentence: a full stop, so the tokenizer sees punctuation too


class SyntheticTextConfig(TextDatasetConfig, frozen=True, extra="forbid"):
    """Synthetic text settings (``TextDatasetConfig`` for packing and the tokenizer).

    Attributes:
        num_clients: clients, one document stream each (``client_00000`` ...).
        words_per_client: words of text per client (about 1.3 bpe tokens each).
        vocabulary: distinct words.
        zipf: the exponent of the words' Zipf frequencies (above 1).
    """

    num_clients: PositiveInt = 200
    words_per_client: PositiveInt = 2_000
    vocabulary: int = Field(5_000, ge=2)
    zipf: float = Field(1.2, gt=1)
    num_buckets: int = Field(4, ge=1, le=65_536)


@register("dataset", "synthetic_text")
class SyntheticText:
    """Seeded Zipf-distributed words, one stream per client, packed as a causal-LM store."""

    Config = SyntheticTextConfig

    def __init__(self, config: SyntheticTextConfig) -> None:
        self.config = config

    def documents(self) -> Iterator[Document]:
        """(client key, sentence) for every sentence of every client, clients in order."""
        cfg = self.config
        rng = np.random.default_rng(cfg.seed)
        words = _words(rng, cfg.vocabulary)
        for client in range(cfg.num_clients):
            ranks = rng.zipf(cfg.zipf, size=cfg.words_per_client) % cfg.vocabulary
            for begin in range(0, cfg.words_per_client, SENTENCE_WORDS):
                sentence = " ".join(words[r] for r in ranks[begin : begin + SENTENCE_WORDS])
                yield f"client_{client:05d}", sentence.capitalize() + "."

    def write_store(self, path: Path, source: dict[str, Any]) -> None:
        """Writes the store in ``path``."""
        write_text_store(self.documents(), self.config, path, source=source)


def _words(rng: np.random.Generator, count: int) -> list[str]:
    """``count`` random lowercase words of 2 to 9 letters (repeats possible, as homographs)."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 10, size=count)
    return ["".join(rng.choice(letters, size=n)) for n in lengths]
