"""One bucket's documents -> each client's packed train and test sequences.

The streaming writer (``raysim.data.text.writer``) groups documents by client key into buckets; this
module turns one bucket into rows: tokenize, split each client's documents (or sequences) into
train and test with a seed drawn from the client key, pack, cap, drop clients that are too small.

Packing follows Dataset Grouper's C4 pipeline (Charles et al., 2023, arXiv:2307.09619): a
client's documents are concatenated, each followed by EOS, and cut into blocks of ``seq_len``
tokens; the incomplete last block is dropped. One *example* of a text store is one such packed
sequence, never a document. The causal-LM loss shifts inside a block (token t predicts t+1), so a
block of ``seq_len`` tokens yields ``seq_len - 1`` predictions.

Usage:
    rows = pack(tokenizer.encode_batch(texts), seq_len=128, eos_id=tokenizer.eos_id)  # (n, 128) int32
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raysim.data.format import SPLIT_STREAM, split_sizes
from raysim.data.text.recipes import TextDatasetConfig
from raysim.data.text.tokenizer import Tokenizer


def key_hash(key: str) -> int:
    """A stable 64-bit hash of a client key (Python's ``hash`` differs between processes)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def pack(documents: Iterable[Sequence[int]], seq_len: int, eos_id: int) -> np.ndarray:
    """Packs one client's tokenized documents into (n, seq_len) int32 sequences.

    Each document is followed by ``eos_id``; the concatenation is cut into consecutive blocks of
    ``seq_len`` tokens and the remainder (fewer than ``seq_len`` tokens) is dropped.

    Args:
        documents: token ids of each document, in order.
        seq_len: tokens per sequence.
        eos_id: the end-of-document token.

    Returns:
        (n, seq_len) int32 array, n = (total tokens + number of documents) // seq_len.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    eos = np.array([eos_id], np.int32)
    parts = [p for doc in documents for p in (np.asarray(doc, np.int32).reshape(-1), eos)]
    stream = np.concatenate(parts) if parts else np.empty(0, np.int32)
    num_rows = len(stream) // seq_len
    return stream[: num_rows * seq_len].reshape(num_rows, seq_len)


def pack_clients(
    table: pa.Table, tokenizer: Tokenizer, config: TextDatasetConfig
) -> tuple[np.ndarray, dict[str, Any], dict[str, int]]:
    """One bucket's documents -> (rows (n, seq_len) int32, index columns, drop counts)."""
    table = table.sort_by([("key", "ascending"), ("seq", "ascending")])
    keys = table.column("key").combine_chunks()
    starts = run_starts(keys)
    ends = np.append(starts[1:], len(keys))
    docs = tokenizer.encode_batch(table.column("text").to_pylist())
    client_keys = keys.take(pa.array(starts)).to_pylist()
    rows: list[np.ndarray] = []
    index: dict[str, list[Any]] = {"key": [], "num_train": [], "num_test": [], "num_documents": []}
    stats = {"dropped_clients": 0, "capped_sequences": 0}
    for key, start, end in zip(client_keys, starts, ends):
        shuffle = np.random.default_rng([config.seed, SPLIT_STREAM, key_hash(key)])
        train, test = split_client(docs[start:end], tokenizer, config, shuffle)
        if len(train) + len(test) < config.min_sequences:
            stats["dropped_clients"] += 1
            continue
        train, test, capped = cap_client(train, test, config)
        stats["capped_sequences"] += capped
        rows.append(np.concatenate([train[shuffle.permutation(len(train))], test]))
        for name, value in (
            ("key", key),
            ("num_train", len(train)),
            ("num_test", len(test)),
            ("num_documents", int(end - start)),
        ):
            index[name].append(value)
    packed_rows = np.concatenate(rows) if rows else np.empty((0, config.seq_len), np.int32)
    return packed_rows, index, stats


def split_client(
    docs: list, tokenizer: Tokenizer, config: TextDatasetConfig, shuffle: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) packed sequences of one client.

    ``split_by: document`` sends whole documents to one side before packing, so no
    text is in both the personalization pool and the evaluation half; ``sequence`` (default) packs first
    and splits the sequences (a single-document client then still has a test split).
    """
    if config.split_by == "sequence":
        packed = pack(docs, config.seq_len, tokenizer.eos_id)
        num_train, _ = split_sizes(np.array([len(packed)]), config.test_fraction)
        packed = packed[shuffle.permutation(len(packed))]
        return packed[: int(num_train[0])], packed[int(num_train[0]) :]
    order = shuffle.permutation(len(docs))
    num_train, _ = split_sizes(np.array([len(docs)]), config.test_fraction)
    train_docs, test_docs = np.sort(order[: int(num_train[0])]), np.sort(order[int(num_train[0]) :])
    return (
        pack([docs[i] for i in train_docs], config.seq_len, tokenizer.eos_id),
        pack([docs[i] for i in test_docs], config.seq_len, tokenizer.eos_id),
    )


def cap_client(
    train: np.ndarray, test: np.ndarray, config: TextDatasetConfig
) -> tuple[np.ndarray, np.ndarray, int]:
    """At most ``max_sequences`` per client, keeping the test share."""
    total = len(train) + len(test)
    if config.max_sequences is None or total <= config.max_sequences:
        return train, test, 0
    keep_test = min(len(test), int(round(config.max_sequences * len(test) / total)))
    keep_train = config.max_sequences - keep_test
    return train[:keep_train], test[:keep_test], total - config.max_sequences


def run_starts(keys: pa.Array) -> np.ndarray:
    """Where each run of equal values starts in a sorted column."""
    if len(keys) == 0:
        return np.empty(0, np.int64)
    changed = pc.not_equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.flatnonzero(changed) + 1]).astype(np.int64)
