"""Text recipes end to end: C4 by host and Stack Overflow by user through the real
``datasets.load_dataset("json", streaming=True)`` path, pydoc topics, ``raysim prepare``, and a
tiny causal LM on the result."""

from __future__ import annotations

import gzip
import json
import math
import urllib.parse

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysim import registry
from raysim.cli.main import main
from raysim.data.format import split_sizes
from raysim.data.prepare import prepare_store, store_path
from raysim.data.store import ClientStore
from raysim.data.text.packing import pack
from raysim.data.text.tokenizer import BYTES_EOS, TokenizerConfig, store_tokenizer

WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have "
    "federated learning client server model round data web page news host"
).split()
BAD_URLS = ["not a url", "", "mailto:someone@example.com", "http://[::1"]


def c4_records(num_docs: int = 300, seed: int = 0) -> list[dict]:
    """C4-schema records over 20 hosts of Zipf-like sizes, 3 tiny hosts and 4 bad URLs."""
    rng = np.random.default_rng(seed)
    hosts = [f"site{i}.example.com" for i in range(18)] + ["www.news.org", "news.org"]
    weights = 1.0 / np.arange(1, 21) ** 1.3
    records = []
    for i in range(num_docs):
        host = hosts[rng.choice(20, p=weights / weights.sum())]
        # upper case and ports must not split a host into several clients
        netloc = host.upper() + ":8080" if i % 7 == 0 else host
        url = f"https://{netloc}/article/{i}?ref=x"
        text = " ".join(rng.choice(WORDS, rng.integers(3, 60)))
        records.append({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": url})
    for i, url in enumerate(BAD_URLS):
        records[10 + 40 * i]["url"] = url
    for i in range(3):  # one short document each: fewer than min_sequences sequences
        records[100 + 50 * i].update(url=f"http://tiny{i}.example.net/", text="a short page")
    return records


def write_c4(directory, records) -> str:
    """Two shards in C4's format (.json and .json.gz); returns a glob over them."""
    directory.mkdir(parents=True, exist_ok=True)
    half = len(records) // 2
    (directory / "c4-train.00000.json").write_text("".join(json.dumps(r) + "\n" for r in records[:half]))
    with gzip.open(directory / "c4-train.00001.json.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records[half:])
    return str(directory / "c4-train.*")


def c4_config(data_files, cache_dir, **options):
    base = dict(
        data_files=data_files,
        cache_dir=str(cache_dir),
        seq_len=32,
        min_sequences=2,
        tokenizer=TokenizerConfig(kind="bytes"),
        num_buckets=4,
    )
    return registry.get("dataset", "c4").config(**{**base, **options})


def expected_clients(records, seq_len: int, min_sequences: int) -> dict[str, np.ndarray]:
    """host -> packed rows, computed here from the records by the documented rule."""
    docs: dict[str, list[list[int]]] = {}
    for r in records:
        host = urllib.parse.urlsplit(r["url"]).hostname if r["url"] not in BAD_URLS else None
        if host:
            docs.setdefault(host, []).append(list(r["text"].encode()))
    packed = {h: pack(d, seq_len, BYTES_EOS) for h, d in sorted(docs.items())}
    return {h: rows for h, rows in packed.items() if len(rows) >= min_sequences}


def content(store: ClientStore):
    rows = np.concatenate(
        [store.client_data(c, s).arrays["x"] for c in range(store.num_clients) for s in ("train", "test")]
    )
    return rows, pq.read_table(store.path / "clients.parquet")


@pytest.fixture(scope="module")
def c4_files(tmp_path_factory):
    records = c4_records()
    return records, write_c4(tmp_path_factory.mktemp("c4"), records)


@pytest.fixture(scope="module")
def c4_store(c4_files, tmp_path_factory):
    _, files = c4_files
    return ClientStore.open(prepare_store("c4", c4_config(files, tmp_path_factory.mktemp("cache"))))


def test_c4_clients_are_hosts_with_all_their_documents(c4_files, c4_store):
    records, _ = c4_files
    expected = expected_clients(records, seq_len=32, min_sequences=2)
    assert 15 <= len(expected) <= 20 and not any(h.startswith("tiny") for h in expected)
    store = c4_store
    assert store.meta["num_dropped_clients"] >= 3
    assert [store.client_key(c) for c in range(store.num_clients)] == list(expected)
    assert "news.org" in expected and "www.news.org" in expected  # full host, no merging
    for cid, host in enumerate(expected):
        train, test = (store.client_data(cid, s).arrays["x"] for s in ("train", "test"))
        assert train.dtype == np.int64 and train.shape[1:] == (32,) and test.shape[1:] == (32,)
        num_train, num_test = split_sizes(np.array([len(expected[host])]), 0.2)
        assert (len(train), len(test)) == (num_train[0], num_test[0])
        assert sorted(map(tuple, np.concatenate([train, test]))) == sorted(map(tuple, expected[host]))
    meta = store.meta
    assert meta["num_documents"] == 300 and meta["num_skipped_documents"] == len(BAD_URLS)
    assert meta["recipe"] == "c4" and meta["config"]["data_files"].endswith("c4-train.*")
    assert store.central_test() is None


def test_c4_store_does_not_depend_on_buffers_or_buckets(c4_files, c4_store, tmp_path):
    _, files = c4_files
    small = ClientStore.open(
        prepare_store("c4", c4_config(files, tmp_path, buffer_docs=5, num_buckets=16, checkpoint_docs=37))
    )
    rows, index = content(small)
    ref_rows, ref_index = content(c4_store)
    assert np.array_equal(rows, ref_rows) and index.equals(ref_index)
    assert small.meta["content_hash"] == c4_store.meta["content_hash"]


def test_interrupted_c4_build_resumes(c4_files, c4_store, tmp_path, monkeypatch):
    _, files = c4_files
    config = c4_config(files, tmp_path, buffer_docs=5, checkpoint_docs=50)
    recipe = type(registry.get("dataset", "c4").factory(config))
    documents = recipe.documents

    def until_150(self):
        for i, doc in enumerate(documents(self)):
            if i == 150:
                raise ConnectionError("stream reset")
            yield doc

    monkeypatch.setattr(recipe, "documents", until_150)
    with pytest.raises(ConnectionError):
        prepare_store("c4", config)
    path = store_path("c4", config)
    build = path.parent / f".{path.name}.build"
    assert json.loads((build / "state.json").read_text())["num_documents"] == 150
    monkeypatch.setattr(recipe, "documents", documents)
    resumed = ClientStore.open(prepare_store("c4", config))
    assert resumed.path == path and not build.exists()
    assert resumed.meta["content_hash"] == c4_store.meta["content_hash"]


def test_tiny_causal_lm_runs_on_pydoc_topics(tmp_path):
    from pydoc_data.topics import topics

    import torch

    from raysim.measure.evaluate import evaluate
    from raysim.models import build_model

    config = registry.get("dataset", "pydoc_topics").config(cache_dir=str(tmp_path))
    store = ClientStore.open(prepare_store("pydoc_topics", config))
    assert 60 <= store.num_clients <= 79 and store.meta["tokenizer"]["name"] == "bpe-4096"
    assert store.client_key(0) == "assert" and (store.path / "tokenizer.json").is_file()
    data = store.client_data(0, "train")
    assert data.arrays["x"].shape[1:] == (64,) and data.arrays["x"].max() < store.spec.num_classes
    decode = store_tokenizer(store.path).decode
    eos = store.meta["tokenizer"]["eos_id"]
    pieces = [
        decode([int(t) for t in piece])
        for row in data.arrays["x"]
        for piece in np.split(row, np.flatnonzero(row == eos))
    ]  # paragraphs end with EOS
    assert all(p.strip() in topics["assert"] for p in pieces if p.strip())
    torch.manual_seed(0)
    model = build_model("hf_causal_lm", {"preset": "tiny"}, store.spec)
    metrics = evaluate(model, data, store.spec)
    assert metrics["num_examples"] == len(data) * 63  # predictions: seq_len - 1 per sequence
    assert abs(metrics["loss"] - math.log(store.spec.num_classes)) < 1.0  # untrained: ~uniform


def test_stackoverflow_clients_are_users(tmp_path):
    rng = np.random.default_rng(1)
    posts = []
    for i in range(200):
        user = None if i % 50 == 0 else int(rng.integers(0, 6))
        tokens = list(rng.choice(WORDS, rng.integers(5, 40)))
        posts.append({"user_id": user, "title": f"question {i}", "tokens": tokens, "score": 1})
    files = tmp_path / "so.jsonl"
    files.write_text("".join(json.dumps(p) + "\n" for p in posts))
    config = registry.get("dataset", "stackoverflow").config(
        data_files=str(files),
        cache_dir=str(tmp_path / "cache"),
        seq_len=16,
        tokenizer=TokenizerConfig(kind="bytes"),
    )
    store = ClientStore.open(prepare_store("stackoverflow", config))
    assert [store.client_key(c) for c in range(store.num_clients)] == [str(u) for u in range(6)]
    assert store.meta["num_skipped_documents"] == 4
    user0 = [f"question {i}\n" + " ".join(p["tokens"]) for i, p in enumerate(posts) if p["user_id"] == 0]
    rows = np.concatenate([store.client_data(0, s).arrays["x"] for s in ("train", "test")])
    expected = pack([list(t.encode()) for t in user0], 16, BYTES_EOS)
    assert sorted(map(tuple, rows)) == sorted(map(tuple, expected))


def test_raysim_prepare_prints_a_summary(c4_files, tmp_path, capsys):
    _, files = c4_files
    args = [
        "prepare",
        "c4",
        f"data_files={files}",
        "seq_len=32",
        "tokenizer.kind=bytes",
        f"cache_dir={tmp_path}",
        "num_buckets=2",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and "c4:" in out and "clients" in out
    assert "tokens (seq_len 32, tokenizer bytes, vocab 258)" in out and "300 documents" in out
    job = {
        "dataset": {
            "name": "c4",
            "data_files": files,
            "seq_len": 32,
            "cache_dir": str(tmp_path),
            "tokenizer": {"kind": "bytes"},
            "num_buckets": 2,
        },
        "model": {"name": "hf_causal_lm"},
        "algorithm": {"name": "fedavg"},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["prepare", str(tmp_path / "job.yaml")]) == 0
    assert out.splitlines()[0] == capsys.readouterr().out.splitlines()[0]  # the same store


def test_raysim_prepare_errors_are_one_message(tmp_path, capsys):
    assert main(["prepare", "pydoc_topic"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'pydoc_topic'; did you mean 'pydoc_topics'?" in err
    assert "Traceback" not in err
    assert main(["prepare", "c4", "seq_len=0", f"cache_dir={tmp_path}"]) == 2
    assert "dataset.seq_len" in capsys.readouterr().err
    missing = f"data_files={tmp_path / 'none.json'}"
    assert main(["prepare", "c4", missing, f"cache_dir={tmp_path}", "tokenizer.kind=bytes"]) == 2
    assert f"no file matches data_files '{tmp_path / 'none.json'}'" in capsys.readouterr().err
