"""``raysim prepare --verify`` and ``--rehash`` through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from raysim.cli.main import main


def prepared(tmp_path: Path, capsys) -> tuple[list[str], Path]:
    """Prepares a small digits store; returns the options that name it and its path."""
    options = ["partition.num_clients=5", f"cache_dir={tmp_path}"]
    assert main(["prepare", "digits", *options]) == 0
    (path,) = tmp_path.glob("digits-*")
    capsys.readouterr()
    return options, path


def test_verify_says_ok_then_names_the_corrupt_file_and_the_commands_that_rebuild_it(tmp_path, capsys):
    options, path = prepared(tmp_path, capsys)
    assert main(["prepare", "digits", *options, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "OK: 3 files" in out and "match their checksums" in out and "digits: 5 clients" in out

    rows = bytearray((path / "rows.arrow").read_bytes())
    rows[len(rows) // 2] ^= 0xFF
    (path / "rows.arrow").write_bytes(bytes(rows))
    assert main(["prepare", "digits", *options, "--verify"]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())  # rich wraps long lines
    assert "FAILED" in captured.out
    assert f"client store {path}: rows.arrow does not match the checksum" in err
    assert f"rm -r {path} && raysim prepare digits partition.num_clients=5 cache_dir={tmp_path}" in err
    assert "Traceback" not in captured.err


def test_verify_of_a_job_checks_each_of_its_stores(tmp_path, capsys):
    job = {
        "name": "v",
        "dataset": {
            "name": "digits",
            "cache_dir": str(tmp_path),
            "partition": {"kind": "iid", "num_clients": 4},
        },
        "model": {"name": "mlp"},
        "algorithm": {"name": "fedavg"},
        "engine": {"num_rounds": 1, "cohort_size": 2},
        "variants": [
            {"name": "a"},
            {"name": "b", "dataset": {"partition": {"kind": "iid", "num_clients": 6}}},
        ],
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["prepare", str(tmp_path / "job.yaml"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.count("OK: 3 files") == 2 and "4 clients" in out and "6 clients" in out


def test_an_older_store_verifies_by_its_content_hash_and_rehash_adds_checksums(tmp_path, capsys):
    options, path = prepared(tmp_path, capsys)
    meta = json.loads((path / "meta.json").read_text())
    older = {k: v for k, v in meta.items() if k not in ("files", "meta_blake2b")}
    (path / "meta.json").write_text(json.dumps(older))

    assert main(["prepare", "digits", *options, "--verify"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "match the store's content hash, but it has no per-file checksums" in out
    assert f"raysim prepare digits partition.num_clients=5 cache_dir={tmp_path} --rehash" in out

    assert main(["prepare", "digits", *options, "--rehash"]) == 0
    assert "recorded and match their checksums" in capsys.readouterr().out
    assert json.loads((path / "meta.json").read_text())["files"] == meta["files"]
