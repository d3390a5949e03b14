"""One bucket's documents -> each client's packed train and test sequences.

The streaming writer (``raysim.data.text.writer``) groups documents by client key into buckets; this
module turns one bucket into rows: tokenize, split each client's documents (or sequences) into
train and test with a seed drawn from the client key, pack, cap, drop clients that are too small.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raysim.data.format import SPLIT_STREAM, split_sizes
from raysim.data.text.tokenizer import TextDatasetConfig, Tokenizer, pack


def key_hash(key: str) -> int:
    """A stable 64-bit hash of a client key (Python's ``hash`` differs between processes)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


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
