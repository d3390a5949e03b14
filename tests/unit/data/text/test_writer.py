"""raysim.data.text.writer: grouping, packing and splitting a shuffled stream; memory; resuming."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raysim.data.format import split_sizes
from raysim.data.store import ClientStore
from raysim.data.text import spill, writer
from raysim.data.text.packing import pack
from raysim.data.text.recipes import TextDatasetConfig
from raysim.data.text.tokenizer import BYTES_EOS, TokenizerConfig, store_tokenizer, train_bpe
from raysim.data.text.writer import write_text_store
from raysim.errors import DataError

WORDS = "the a federated client model round data host text token of in on and server".split()


def corpus(num_docs: int = 120, seed: int = 0) -> list[tuple[str | None, str]]:
    """Documents of 12 clients of very different sizes, interleaved; two without a key."""
    rng = np.random.default_rng(seed)
    keys = [f"k{i:02d}" for i in range(12)]
    weights = np.array([30, 20, 10, 8, 6, 5, 4, 3, 2, 1, 0.5, 0.5])
    docs = []
    for i in range(num_docs):
        key = keys[rng.choice(12, p=weights / weights.sum())]
        text = " ".join(rng.choice(WORDS, rng.integers(1, 30))) + "."
        docs.append((key, text))
    docs[5], docs[50] = (None, "no key"), ("k00", "")  # skipped, counted
    return docs


def config(**options) -> TextDatasetConfig:
    base = dict(
        seq_len=16,
        tokenizer=TokenizerConfig(kind="bytes"),
        min_sequences=3,
        num_buckets=3,
        buffer_docs=1000,
        test_fraction=0.25,
    )
    return TextDatasetConfig(**{**base, **options})


def build(tmp_path, name, docs, **options):
    return ClientStore.open(write_text_store(iter(docs), config(**options), tmp_path / name, progress=False))


def store_content(store: ClientStore) -> tuple:
    rows = pa.ipc.open_file(pa.memory_map(str(store.path / "rows.arrow"))).read_all()
    return rows.column("x").combine_chunks(), pq.read_table(store.path / "clients.parquet")


def test_store_groups_packs_and_splits_every_client(tmp_path):
    docs = corpus()
    store = build(tmp_path, "s", docs)
    cfg = config()
    by_key: dict[str, list[list[int]]] = {}
    for key, text in docs:
        if key is not None and text:
            by_key.setdefault(key, []).append(list(text.encode()))  # stream order within a key
    expected = {k: pack(d, cfg.seq_len, BYTES_EOS) for k, d in sorted(by_key.items())}
    kept = [k for k, rows in expected.items() if len(rows) >= cfg.min_sequences]
    assert 0 < len(kept) < len(expected)  # the small clients were dropped
    assert [store.client_key(c) for c in range(store.num_clients)] == kept  # sorted keys
    for cid, key in enumerate(kept):
        train, test = (store.client_data(cid, s).arrays["x"] for s in ("train", "test"))
        n = len(expected[key])
        assert (len(train), len(test)) == tuple(int(v[0]) for v in split_sizes(np.array([n]), 0.25))
        assert train.dtype == np.int64 and train.shape[1] == cfg.seq_len
        # every document of the key, and nothing else, in the client's rows (shuffled)
        got = np.concatenate([train, test])
        assert sorted(map(tuple, got)) == sorted(map(tuple, expected[key]))
    meta = store.meta
    assert meta["num_skipped_documents"] == 2 and meta["num_documents"] == len(docs)
    assert meta["num_dropped_clients"] == len(expected) - len(kept)
    assert meta["spec"] == {
        "task": "causal_lm",
        "input_shape": [16],
        "num_classes": 258,
        "pad_token_id": None,
        "metrics": [],
    }
    assert meta["num_tokens"] == 16 * sum(len(expected[k]) for k in kept)
    names = sorted(p.name for p in store.path.iterdir())
    assert names == ["clients.parquet", "counts.npy", "meta.json", "rows.arrow"]


def test_split_shuffle_is_seeded(tmp_path):
    docs = corpus()
    a, b = build(tmp_path, "a", docs), build(tmp_path, "b", docs, seed=1)
    test_a, test_b = (s.client_data(0, "test").arrays["x"] for s in (a, b))
    assert test_a.shape == test_b.shape and not np.array_equal(test_a, test_b)


def test_result_is_independent_of_buckets_and_buffers_and_memory_stays_bounded(tmp_path, monkeypatch):
    docs = corpus()
    reference = store_content(build(tmp_path, "ref", docs, num_buckets=1, buffer_docs=10_000))
    largest = []
    add = spill._Spill.add

    def watched_add(self, seq, key, text):
        add(self, seq, key, text)
        largest.append(max(len(b) for b in self.buffers))

    monkeypatch.setattr(spill._Spill, "add", watched_add)
    small = build(tmp_path, "small", docs, num_buckets=7, buffer_docs=5, checkpoint_docs=11)
    assert max(largest) < 5  # a full buffer is flushed at once
    rows, index = store_content(small)
    assert rows.equals(reference[0]) and index.equals(reference[1])


def failing(docs, after: int):
    for i, doc in enumerate(docs):
        if i == after:
            raise RuntimeError("source lost")
        yield doc


def test_interrupted_spill_resumes_from_its_checkpoint(tmp_path):
    docs = corpus()
    cfg = config(num_buckets=4, buffer_docs=4, checkpoint_docs=20)
    path = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="source lost"):
        write_text_store(failing(docs, 73), cfg, path, progress=False)
    state = json.loads((path / "state.json").read_text())
    assert state["num_documents"] == 60 and not state["is_spilled"]
    # Garbage where the checkpointed documents were: a resumed build skips them, a restart would not.
    rerun = [("zz", "garbage " * 50)] * 60 + docs[60:]
    write_text_store(iter(rerun), cfg, path, progress=False)
    uninterrupted = write_text_store(iter(docs), cfg, tmp_path / "whole", progress=False)
    assert store_content(ClientStore.open(path))[0].equals(store_content(ClientStore.open(uninterrupted))[0])
    assert store_content(ClientStore.open(path))[1].equals(store_content(ClientStore.open(uninterrupted))[1])
    assert json.loads((path / "meta.json").read_text())["num_skipped_documents"] == 2


def test_interrupted_packing_resumes_at_the_next_bucket(tmp_path, monkeypatch):
    docs = corpus()
    cfg = config(num_buckets=4)
    calls = []
    pack_clients = writer.pack_clients

    def fail_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return pack_clients(*args)

    monkeypatch.setattr(writer, "pack_clients", fail_third)
    path = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="killed"):
        write_text_store(iter(docs), cfg, path, progress=False)
    assert json.loads((path / "state.json").read_text())["num_buckets_done"] == 2
    write_text_store(iter([]), cfg, path, progress=False)  # spilled already: the source is unused
    assert len(calls) == 3 + 2
    whole = write_text_store(iter(docs), cfg, tmp_path / "whole", progress=False)
    resumed, uninterrupted = store_content(ClientStore.open(path)), store_content(ClientStore.open(whole))
    assert resumed[0].equals(uninterrupted[0]) and resumed[1].equals(uninterrupted[1])  # rows and index
    assert ClientStore.open(path).meta["files"] == ClientStore.open(whole).meta["files"]  # checksums


def test_another_config_in_the_build_directory_starts_over(tmp_path):
    docs = corpus()
    path = tmp_path / "s"
    with pytest.raises(RuntimeError):
        write_text_store(failing(docs, 50), config(checkpoint_docs=10), path, progress=False)
    store = ClientStore.open(write_text_store(iter(docs), config(seq_len=8), path, progress=False))
    assert store.spec.input_shape == (8,) and store.meta["num_documents"] == len(docs)


def test_errors_are_clear(tmp_path):
    with pytest.raises(DataError, match="no client has min_sequences=3"):
        write_text_store(iter([("a", "tiny")]), config(), tmp_path / "a", progress=False)
    with pytest.raises(DataError, match=r"document 1 must be a \(client key"):
        write_text_store(iter([("a", "x"), ("b", 3)]), config(), tmp_path / "b", progress=False)


def test_store_keeps_a_copy_of_its_hf_tokenizer(tmp_path):
    from transformers import PreTrainedTokenizerFast

    docs = corpus()
    rust = train_bpe((text for _, text in docs), TokenizerConfig(kind="bpe", vocab_size=300))
    PreTrainedTokenizerFast(tokenizer_object=rust, eos_token="<|endoftext|>").save_pretrained(
        str(tmp_path / "tok")
    )
    tokenizer = TokenizerConfig(kind="hf", name_or_path=str(tmp_path / "tok"))
    store = build(tmp_path, "s", docs, tokenizer=tokenizer, seq_len=8)
    shutil.rmtree(tmp_path / "tok")  # the store's own copy is enough from now on
    assert store.spec.num_classes == 300 and store.meta["tokenizer"]["pad_id"] is None
    key = store.client_key(0)
    text = "".join(t for k, t in docs if k == key)  # EOS decodes to nothing
    decode = store_tokenizer(store.path).decode
    assert all(decode(row) in text for row in store.client_data(0, "train").arrays["x"])
