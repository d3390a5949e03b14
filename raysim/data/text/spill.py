"""Stage 1 of the streaming writer: documents spilled into hash buckets on disk, and read back.

Each document goes to one of ``num_buckets`` buckets by a hash of its client key, buffered and
flushed as Arrow part files (``raysim.data.text.writer`` describes the stages).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from raysim.data.text.build_state import SPILL_DIR, BuildState, progress_bar
from raysim.data.text.packing import key_hash
from raysim.data.text.recipes import TextDatasetConfig
from raysim.errors import DataError

Document = tuple[str | None, str]  # (client key, text); a None key skips the document
SPILL_SCHEMA = pa.schema([("seq", pa.int64()), ("key", pa.string()), ("text", pa.large_string())])
# zstd: spill files are read once, whole; text shrinks about 3x
_SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


class _Spill:
    """Bucketed spill of documents: at most ``buffer_docs`` documents per bucket in memory."""

    def __init__(self, directory: Path, num_buckets: int, buffer_docs: int, next_part: int) -> None:
        self.directory = directory
        self.buffer_docs = buffer_docs
        self.next_part = next_part
        self.buffers: list[list[tuple[int, str, str]]] = [[] for _ in range(num_buckets)]

    def add(self, seq: int, key: str, text: str) -> None:
        bucket = key_hash(key) % len(self.buffers)
        self.buffers[bucket].append((seq, key, text))
        if len(self.buffers[bucket]) >= self.buffer_docs:
            self.flush(bucket)

    def flush(self, bucket: int) -> None:
        rows = self.buffers[bucket]
        if not rows:
            return
        seqs, keys, texts = zip(*rows)
        table = pa.table(
            [pa.array(seqs, pa.int64()), pa.array(keys, pa.string()), pa.array(texts, pa.large_string())],
            schema=SPILL_SCHEMA,
        )
        folder = self.directory / f"{bucket:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        with pa.ipc.new_file(
            folder / f"{self.next_part:09d}.arrow", SPILL_SCHEMA, options=_SPILL_OPTIONS
        ) as writer:
            writer.write_table(table)
        self.next_part += 1
        self.buffers[bucket] = []

    def flush_all(self) -> None:
        for bucket in range(len(self.buffers)):
            self.flush(bucket)


def spill_documents(
    documents: Iterator[Document], config: TextDatasetConfig, build: Path, state: BuildState, progress: bool
) -> None:
    """Stage 1: streams the documents into bucket part files, checkpointing as it goes."""
    spill_dir = build / SPILL_DIR
    for part in spill_dir.glob("*/*.arrow"):  # written after the last checkpoint: redone below
        if int(part.stem) >= state.num_parts:
            part.unlink()
    spill = _Spill(spill_dir, config.num_buckets, config.buffer_docs, state.num_parts)

    def checkpoint(seq: int, skipped: int) -> None:
        spill.flush_all()
        state.num_documents, state.num_skipped, state.num_parts = seq, skipped, spill.next_part
        state.save(build)

    seq, skipped = state.num_documents, state.num_skipped
    with progress_bar(progress, "spill", "doc", initial=seq) as bar:
        for document in itertools.islice(documents, seq, None):
            key, text = _check_document(document, seq)
            if key is None or not text:
                skipped += 1
            else:
                spill.add(seq, key, text)
            seq += 1
            bar.update(1)
            if seq % config.checkpoint_docs == 0:
                checkpoint(seq, skipped)
                bar.set_postfix(skipped=skipped)
    checkpoint(seq, skipped)
    state.is_spilled = True
    state.save(build)


def _check_document(document: Any, seq: int) -> Document:
    if (
        not isinstance(document, tuple)
        or len(document) != 2
        or not isinstance(document[1], str)
        or not (document[0] is None or isinstance(document[0], str))
    ):
        raise DataError(
            f"document {seq} must be a (client key: str | None, text: str) pair, "
            f"got {type(document).__name__} {str(document)[:80]!r}"
        )
    return document


def bucket_parts(build: Path, bucket: int) -> list[Path]:
    """A bucket's part files in write order, which is stream order."""
    return sorted((build / SPILL_DIR / f"{bucket:05d}").glob("*.arrow"))


def read_part(path: Path) -> pa.Table:
    with pa.ipc.open_file(path) as reader:
        return reader.read_all()


def sample_texts(build: Path, num_buckets: int, limit: int) -> Iterator[str]:
    """Stage 2's sample, read lazily: the texts of the first ``limit`` documents, in order.

    Each bucket's parts are in stream order, so only the head of every bucket is read.
    """
    tables = []
    for bucket in range(num_buckets):
        for part in bucket_parts(build, bucket):
            table = read_part(part)
            tables.append(table.filter(pc.less(table.column("seq"), limit)))
            if pc.max(table.column("seq")).as_py() >= limit:
                break
    if tables:
        yield from pa.concat_tables(tables).sort_by("seq").column("text").to_pylist()
