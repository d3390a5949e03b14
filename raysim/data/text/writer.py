"""Streaming writer of text client stores, for corpora that never fit in memory (C4 by host).

Input: documents ``(client_key, text)`` in any order (C4 is not grouped by host). Output: the
store layout of ``raysim.data.format``, read by ``ClientStore.open``: column ``x`` of
``rows.arrow`` is ``fixed_size_list<int32>[seq_len]``, one packed sequence per row
(``raysim.data.text.packing.pack``); clients are sorted by key, their rows contiguous, train
rows then test rows, split by ``raysim.data.format.split_sizes`` after a shuffle seeded by
``(seed, key)``. No central test set.

The build runs in a directory that survives a failure (``build_state.py``), in four resumable
stages:

 1. spill (``spill.py``): each document goes to one of ``num_buckets`` buckets by a hash of its
    key, buffered (at most ``buffer_docs`` documents per bucket in memory) and flushed as Arrow
    part files. Every ``checkpoint_docs`` documents all buffers are flushed and ``state.json``
    records the documents consumed and parts written; a re-run drops later parts and skips what
    was consumed.
 2. tokenizer: bpe is trained on the first ``tokenizer.sample_documents`` documents of the stream.
 3. buckets, one at a time (a bucket holds whole clients; choose ``num_buckets`` so that
    corpus / num_buckets fits in memory): group by key with documents in stream order, tokenize,
    pack, drop clients with fewer than ``min_sequences`` sequences, shuffle and split.
 4. merge: every bucket's clients in key order -> rows.arrow, clients.parquet, meta.json (last).

Documents with no key (``None``) or empty text are skipped and counted (``num_skipped_documents``
in meta.json). The result depends on neither ``num_buckets``, ``buffer_docs`` nor interruptions.

Usage:
    write_text_store(iter([("a.com", "some text"), ...]), config, "/tmp/store")
    store = ClientStore.open("/tmp/store")
"""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raysim.data.format import BATCH_ROWS, COUNTS_FILE, INDEX_FILE, ROWS_FILE, is_complete, write_meta
from raysim.data.store import map_arrow
from raysim.data.text.build_state import (
    BUCKET_DIR,
    SPILL_DIR,
    BuildState,
    load_state,
    locked,
    progress_bar,
    remove_scratch,
)
from raysim.data.text.packing import pack_clients
from raysim.data.text.recipes import TextDatasetConfig
from raysim.data.text.spill import (
    SPILL_SCHEMA,
    Document,
    bucket_parts,
    read_part,
    sample_texts,
    spill_documents,
)
from raysim.data.text.tokenizer import BPE_FILE, HF_DIR, Tokenizer, load_tokenizer, prepare_tokenizer
from raysim.errors import DataError
from raysim.types import DataSpec

_BATCH_BYTES = 64 << 20  # record batches of rows.arrow: at most ~64 MiB of tokens
_BUCKET_INDEX_SCHEMA = pa.schema(
    [("key", pa.string()), ("num_train", pa.int64()), ("num_test", pa.int64()), ("num_documents", pa.int64())]
)


def write_text_store(
    documents: Iterable[Document],
    config: TextDatasetConfig,
    path: str | Path,
    *,
    source: dict[str, Any] | None = None,
    progress: bool = True,
) -> Path:
    """Builds a text client store in ``path`` from a stream of documents, or resumes the build.

    Args:
        documents: ``(client_key, text)`` pairs in any order; the same order on a re-run.
        config: packing, tokenizer, split and memory settings.
        path: the build directory; it becomes the store. A re-run with the same config and
            source continues where the last one stopped.
        source: what the store was built from (recipe name, config), recorded in meta.json.
        progress: show progress bars (documents/s, clients) on a terminal.

    Returns:
        ``path``.

    Raises:
        DataError: another process is building in ``path``, a document is malformed, or no
            client has ``min_sequences`` sequences.
    """
    build = Path(path)
    build.mkdir(parents=True, exist_ok=True)
    if is_complete(build):
        remove_scratch(build)  # left when a finished build stopped before tidying up
        return build
    with locked(build):
        state = load_state(build, config, source)
        if not state.is_spilled:
            spill_documents(iter(documents), config, build, state, progress)
        if not state.has_tokenizer:
            texts = sample_texts(build, config.num_buckets, config.tokenizer.sample_documents)
            prepare_tokenizer(config.tokenizer, texts, build)
            state.has_tokenizer = True
            state.save(build)
        tokenizer = load_tokenizer(config.tokenizer, build)
        _pack_buckets(config, build, state, tokenizer, progress)
        index = _merge_buckets(build, config)
        _write_meta(build, config, state, tokenizer, index, source)  # the store is complete
    remove_scratch(build)
    return build


def _pack_buckets(
    config: TextDatasetConfig, build: Path, state: BuildState, tokenizer: Tokenizer, progress: bool
) -> None:
    """Stage 3: packs the clients of every bucket not done yet; each bucket is a checkpoint."""
    (build / BUCKET_DIR).mkdir(exist_ok=True)
    num_clients = sum(
        pq.read_metadata(build / BUCKET_DIR / f"{b:05d}.parquet").num_rows
        for b in range(state.num_buckets_done)
    )
    with progress_bar(
        progress, "pack", "bucket", total=config.num_buckets, initial=state.num_buckets_done
    ) as bar:
        for bucket in range(state.num_buckets_done, config.num_buckets):
            parts = [read_part(p) for p in bucket_parts(build, bucket)]
            table = pa.concat_tables(parts) if parts else SPILL_SCHEMA.empty_table()
            rows, index, stats = pack_clients(table, tokenizer, config)
            _write_bucket(build, bucket, rows, index, config.seq_len)
            state.num_buckets_done = bucket + 1
            state.num_dropped_clients += stats["dropped_clients"]
            state.num_capped_sequences += stats["capped_sequences"]
            state.save(build)
            shutil.rmtree(build / SPILL_DIR / f"{bucket:05d}", ignore_errors=True)
            bar.update(1)
            num_clients += len(index["key"])
            bar.set_postfix(clients=num_clients)


def _write_bucket(build: Path, bucket: int, rows: np.ndarray, index: dict[str, Any], seq_len: int) -> None:
    """A bucket's packed rows (Arrow IPC, memory-mappable) and its clients (parquet)."""
    stem = build / BUCKET_DIR / f"{bucket:05d}"
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), seq_len)})
    with pa.ipc.new_file(f"{stem}.arrow.tmp", table.schema) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    pq.write_table(
        pa.table({**index, "key": pa.array(index["key"], pa.string())}, schema=_BUCKET_INDEX_SCHEMA),
        f"{stem}.parquet.tmp",
    )
    # renamed only when both are complete: a bucket is done exactly when state.json says so
    os.replace(f"{stem}.arrow.tmp", f"{stem}.arrow")
    os.replace(f"{stem}.parquet.tmp", f"{stem}.parquet")


def _merge_buckets(build: Path, config: TextDatasetConfig) -> pa.Table:
    """Stage 4: writes rows.arrow and clients.parquet with every client in key order.

    Returns:
        the client index (clients.parquet's table).
    """
    tables = []
    for bucket in range(config.num_buckets):
        table = pq.read_table(build / BUCKET_DIR / f"{bucket:05d}.parquet")
        sizes = (pc.add(table.column("num_train"), table.column("num_test"))).to_numpy()
        local = (np.cumsum(sizes) - sizes).astype(np.int64)  # each client's first row
        tables.append(
            table.append_column("bucket", pa.array(np.full(len(sizes), bucket, np.int64))).append_column(
                "local_offset", pa.array(local)
            )
        )
    index = pa.concat_tables(tables).sort_by("key")
    if index.num_rows == 0:
        raise DataError(
            f"no client has min_sequences={config.min_sequences} sequences of "
            f"{config.seq_len} tokens; lower seq_len or min_sequences, or add documents"
        )
    sizes = pc.add(index.column("num_train"), index.column("num_test")).to_numpy()
    _write_rows(build, index, sizes, config.seq_len)
    offsets = (np.cumsum(sizes) - sizes).astype(np.int64)
    clients = pa.table(
        {
            "client_id": pa.array(np.arange(index.num_rows, dtype=np.int64)),
            "key": index.column("key"),
            "offset": pa.array(offsets),
            "num_train": index.column("num_train"),
            "num_test": index.column("num_test"),
            "num_documents": index.column("num_documents"),
        }
    )
    pq.write_table(clients, build / INDEX_FILE, row_group_size=BATCH_ROWS)
    counts = [offsets, index.column("num_train").to_numpy(), index.column("num_test").to_numpy()]
    np.save(build / COUNTS_FILE, np.stack(counts).astype(np.int64))  # memory-mapped by readers
    return clients


def _write_rows(build: Path, index: pa.Table, sizes: np.ndarray, seq_len: int) -> None:
    """Copies every client's rows from its bucket file into rows.arrow, in index order."""
    _allow_open_files(index.column("bucket").to_numpy().max() + 1)
    batch_rows = max(1, min(BATCH_ROWS, _BATCH_BYTES // (4 * seq_len)))
    buckets: dict[int, pa.Table] = {}
    schema = pa.schema([("x", pa.list_(pa.int32(), seq_len))])
    with pa.ipc.new_file(build / ROWS_FILE, schema) as writer:  # uncompressed: memory-mapped
        pending, num_pending = [], 0
        for bucket, local, size in zip(
            index.column("bucket").to_numpy(), index.column("local_offset").to_numpy(), sizes
        ):
            if bucket not in buckets:
                buckets[bucket] = map_arrow(build / BUCKET_DIR / f"{bucket:05d}.arrow")
            pending.append(buckets[bucket].slice(int(local), int(size)))
            num_pending += size
            if num_pending >= batch_rows:
                writer.write_table(pa.concat_tables(pending).combine_chunks(), max_chunksize=batch_rows)
                pending, num_pending = [], 0
        if pending:
            writer.write_table(pa.concat_tables(pending).combine_chunks(), max_chunksize=batch_rows)


def _allow_open_files(needed: int) -> None:
    """Raises the soft open-file limit when the merge maps more bucket files than it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed + 256, hard), hard))


def _write_meta(
    build: Path,
    config: TextDatasetConfig,
    state: BuildState,
    tokenizer: Tokenizer,
    index: pa.Table,
    source: dict[str, Any] | None,
) -> None:
    """meta.json, last: its presence marks the store complete."""
    num_rows = int(pc.sum(index.column("num_train")).as_py() + pc.sum(index.column("num_test")).as_py())
    # Packed rows hold no padding: pad_token_id None leaves every token in the loss and keeps HF
    # models on their unmasked (fast) attention path. The tokenizer's pad id is in "tokenizer".
    spec = DataSpec("causal_lm", (config.seq_len,), tokenizer.vocab_size, None)
    files = {"bpe": BPE_FILE, "hf": HF_DIR, "bytes": None}
    tokenizer_file = files[config.tokenizer.kind]
    write_meta(
        build,
        {
            **(source or {}),
            "spec": asdict(spec),
            "num_clients": index.num_rows,
            "num_rows": num_rows,
            "test_fraction": config.test_fraction,
            "seed": config.seed,
            "mean": None,
            "std": None,
            "has_central_test": False,
            "has_label_hist": False,
            "seq_len": config.seq_len,
            "num_tokens": num_rows * config.seq_len,
            "num_documents": state.num_documents,
            "num_skipped_documents": state.num_skipped,
            "num_dropped_clients": state.num_dropped_clients,
            "num_capped_sequences": state.num_capped_sequences,
            "tokenizer": {
                "config": config.tokenizer.model_dump(mode="json"),
                "name": tokenizer.name,
                "vocab_size": tokenizer.vocab_size,
                "eos_id": tokenizer.eos_id,
                "pad_id": tokenizer.pad_id,
                "file": tokenizer_file,
            },
        },
        # checksummed: the tokenizer gives ids their meaning
        extra_files=[COUNTS_FILE, *([tokenizer_file] if tokenizer_file else [])],
    )
