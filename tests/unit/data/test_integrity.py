"""Per-file checksums of client stores: recorded at prepare time, checked on open and on demand."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from raysim.data.integrity import rehash_store, verify_store
from raysim.data.partition import DirichletPartition, Partition
from raysim.data.prepare import open_dataset, prepare_store, store_path, write_store
from raysim.data.store import ClientStore, Examples, image_table
from raysim.data.text.recipes import TextDatasetConfig
from raysim.data.text.tokenizer import TokenizerConfig
from raysim.data.text.writer import write_text_store
from raysim.errors import DataError
from raysim.types import DataSpec


@pytest.fixture
def store_dir(tmp_path) -> Path:
    """12 random 1x2x2 images over 3 clients, with a central test set."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 1, 2, 2), dtype=np.uint8)
    central = image_table(images[:2], np.array([0, 1]))
    examples = Examples(
        image_table(images, np.arange(12) % 3), DataSpec("classification", (1, 2, 2), 3), central
    )
    part = Partition(order=rng.permutation(12), sizes=[4, 4, 4])
    return write_store(examples, part, 0.25, seed=0, path=tmp_path / "s")


def meta_of(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())


def flip_byte(path: Path, position: int = -1) -> None:
    """Corrupts one byte and keeps the size: only a hash can tell."""
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def drop_checksums(path: Path) -> None:
    """Makes ``path`` look like a store prepared before per-file checksums existed (and before
    counts.npy, so that its index is read from clients.parquet)."""
    meta = meta_of(path)
    del meta["files"], meta["meta_blake2b"]
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "counts.npy").unlink()


def test_meta_records_each_file_size_and_blake2b_and_the_content_hash_keeps_its_definition(store_dir):
    files = meta_of(store_dir)["files"]
    assert sorted(files) == ["central_test.arrow", "clients.parquet", "counts.npy", "rows.arrow"]
    for name, entry in files.items():
        data = (store_dir / name).read_bytes()
        assert entry == {"bytes": len(data), "blake2b": hashlib.blake2b(data).hexdigest()}
    # content_hash as every store before this change computed it: blake2b-128 of the digests
    outer = hashlib.blake2b(digest_size=16)
    for name in ("rows.arrow", "clients.parquet", "central_test.arrow"):
        outer.update(hashlib.blake2b((store_dir / name).read_bytes()).digest())
    assert meta_of(store_dir)["content_hash"] == outer.hexdigest()


def test_an_intact_store_verifies(store_dir):
    check = verify_store(store_dir)
    assert check.has_checksums and check.num_files == 4
    assert check.num_bytes == sum(e["bytes"] for e in meta_of(store_dir)["files"].values())


@pytest.mark.parametrize("name", ["rows.arrow", "clients.parquet", "central_test.arrow"])
def test_one_corrupt_byte_fails_verification_naming_the_file(store_dir, name):
    flip_byte(store_dir / name, position=len((store_dir / name).read_bytes()) // 2)
    ClientStore.open(store_dir)  # same size: the cheap check on open cannot see it
    with pytest.raises(DataError, match=f"client store {store_dir}: {name} does not match the checksum") as e:
        verify_store(store_dir)
    assert f"rm -r {store_dir}" in str(e.value)


def test_truncation_is_caught_on_open_by_the_size_check(store_dir):
    rows = store_dir / "rows.arrow"
    rows.write_bytes(rows.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"rows.arrow is [0-9,]+ bytes, not the [0-9,]+ it was written with"):
        ClientStore.open(store_dir)


def test_a_malformed_files_entry_is_a_data_error(store_dir):
    meta = meta_of(store_dir)
    del meta["meta_blake2b"]  # as in a store prepared before it: content checks still run
    (store_dir / "meta.json").write_text(json.dumps({**meta, "files": {"rows.arrow": 3}}))
    with pytest.raises(DataError, match="meta.json has a malformed 'files' entry"):
        ClientStore.open(store_dir)


def test_a_store_without_checksums_opens_verifies_by_content_hash_and_can_be_rehashed(store_dir):
    recorded = meta_of(store_dir)["files"]
    drop_checksums(store_dir)
    assert ClientStore.open(store_dir).num_clients == 3
    check = verify_store(store_dir)
    assert not check.has_checksums and check.num_files == 3
    assert rehash_store(store_dir).has_checksums
    del recorded["counts.npy"]  # such a store keeps reading its counts from clients.parquet
    assert meta_of(store_dir)["files"] == recorded  # what prepare would have written
    assert verify_store(store_dir).has_checksums


def test_a_corrupt_store_without_checksums_fails_by_content_hash_and_is_not_rehashed(store_dir):
    drop_checksums(store_dir)
    flip_byte(store_dir / "rows.arrow", position=200)
    before = (store_dir / "meta.json").read_text()
    for check in (verify_store, rehash_store):
        with pytest.raises(DataError, match="do not match the content hash recorded when it was prepared"):
            check(store_dir)
    assert (store_dir / "meta.json").read_text() == before


def test_open_dataset_hashes_small_stores_and_the_fix_rebuilds_exactly_that_store(tmp_path, monkeypatch):
    from raysim.cli.main import prepare_targets
    from raysim.config import apply_overrides
    from raysim.registry import get

    config = get("dataset", "digits").config(
        partition=DirichletPartition(num_clients=7, alpha=0.3), seed=3, cache_dir=str(tmp_path / "cache")
    )
    path = prepare_store("digits", config)
    open_dataset("digits", config)
    flip_byte(path / "rows.arrow", position=5000)
    with pytest.raises(DataError, match="rows.arrow does not match the checksum") as e:
        open_dataset("digits", config)
    # the message's commands: delete the store, then prepare it with these options
    remove, prepare = str(e.value).split(": rm -r ", 1)[1].split(" && ")
    assert Path(shlex.split(remove)[0]) == path
    words = shlex.split(prepare)
    assert words[:3] == ["raysim", "prepare", "digits"]
    assert apply_overrides({}, words[3:]) == {  # a partition of another kind than the default: whole
        "partition": {"kind": "dirichlet", "num_clients": 7, "alpha": 0.3, "min_size": 10},
        "seed": 3,
        "cache_dir": str(tmp_path / "cache"),
    }
    ((name, again),) = prepare_targets("digits", words[3:])
    assert store_path(name, again) == path
    # above FULL_CHECK_BYTES only the sizes are checked when a run opens the store
    monkeypatch.setattr("raysim.data.prepare.FULL_CHECK_BYTES", 1000)
    assert open_dataset("digits", config).num_clients == 7


def test_text_stores_checksum_their_tokenizer(tmp_path):
    words = "the a federated client model round data host text token".split()
    rng = np.random.default_rng(0)
    docs = [(f"k{i % 3}", " ".join(rng.choice(words, 40))) for i in range(30)]
    cfg = TextDatasetConfig(
        seq_len=16, tokenizer=TokenizerConfig(kind="bpe", vocab_size=300), min_sequences=2, num_buckets=2
    )
    path = write_text_store(iter(docs), cfg, tmp_path / "s", progress=False)
    files = meta_of(path)["files"]
    assert sorted(files) == ["clients.parquet", "counts.npy", "rows.arrow", "tokenizer.json"]
    assert verify_store(path).num_files == 4
    flip_byte(path / "tokenizer.json", position=10)
    with pytest.raises(DataError, match="tokenizer.json does not match the checksum"):
        verify_store(path)


@pytest.mark.parametrize(
    "edit",
    [lambda meta: meta | {"mean": [0.9]}, lambda meta: meta | {"spec": {**meta["spec"], "num_classes": 2}}],
    ids=["mean", "spec.num_classes"],
)
def test_an_edited_meta_json_fails_on_open_and_on_verify_naming_the_file_and_the_fix(store_dir, edit):
    """meta.json is no data file, so the per-file checksums cannot see it: its own digest does."""
    (store_dir / "meta.json").write_text(json.dumps(edit(meta_of(store_dir)), indent=4))
    for check in (ClientStore.open, verify_store):
        with pytest.raises(DataError, match=f"client store {store_dir}: meta.json does not match") as e:
            check(store_dir)
        assert f"rm -r {store_dir}" in str(e.value)


def test_a_relaid_meta_json_still_opens(store_dir):
    """The digest covers the content, not the file's layout."""
    (store_dir / "meta.json").write_text(json.dumps(meta_of(store_dir), indent=None, sort_keys=True))
    assert verify_store(store_dir).has_checksums


def test_a_store_without_a_meta_digest_opens_and_rehash_records_it(store_dir):
    meta = meta_of(store_dir)
    recorded = meta.pop("meta_blake2b")
    (store_dir / "meta.json").write_text(json.dumps(meta))
    assert ClientStore.open(store_dir).num_clients == 3
    rehash_store(store_dir)
    assert meta_of(store_dir)["meta_blake2b"] == recorded
    (store_dir / "meta.json").write_text(json.dumps(meta_of(store_dir) | {"mean": [0.9]}))
    with pytest.raises(DataError, match="meta.json does not match"):
        ClientStore.open(store_dir)
