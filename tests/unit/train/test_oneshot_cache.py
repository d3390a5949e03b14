"""The one-shot cache's checks beyond the checksum: a manifest rewritten to vouch for a bad file, an
entry without a manifest, another job's manifest; each is a miss (retrain), never a model
(end to end: tests/integration/algorithms/test_oneshot_cache_run.py)."""

import json
import logging

import numpy as np
import pytest
import torch

from raysim.train.local import LocalTrainConfig
from raysim.train.oneshot_cache import MANIFEST, CacheEntry, file_digest
from raysim.types import DataSpec, RunInfo

INFO = RunInfo(2, 2, 1, DataSpec("classification", (2,), 2), seed=0, model={"name": "linear"})
LIKE = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
MODELS = {c: {"w": np.full((2, 2), c + 1.0, np.float32), "b": np.zeros(2, np.float32)} for c in range(2)}
WEIGHTS = {0: 10.0, 1: 30.0}


def written_entry(tmp_path) -> CacheEntry:
    entry = CacheEntry.open(str(tmp_path / "cache"), INFO, LocalTrainConfig(), np.arange(2))
    entry.write(MODELS, WEIGHTS)
    return entry


def forge(entry: CacheEntry, client: int, saved: dict) -> None:
    """Rewrites a client's file and its manifest record to match: only the content checks can tell."""
    path = entry.files[client]
    torch.save(saved, path)
    manifest = json.loads((entry.folder / MANIFEST).read_text())
    record = manifest["clients"][str(client)]
    record |= {"bytes": path.stat().st_size, "blake2b": file_digest(path)}
    (entry.folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_written_entry_reads_back_as_written(tmp_path):
    models, weights = written_entry(tmp_path).read(LIKE, check_shapes=True)
    assert weights == WEIGHTS and all(np.array_equal(models[c]["w"], MODELS[c]["w"]) for c in range(2))


@pytest.mark.parametrize(
    ("saved", "why"),
    [
        ({"params": {"w": torch.ones(2, 2), "b": torch.zeros(2)}, "weight": -1e30}, "weight -1e+30"),
        ({"params": {"w": torch.ones(4), "b": torch.zeros(2)}, "weight": 30.0}, "does not fit"),
        ({"params": {"w": torch.full((2, 2), float("nan")), "b": torch.zeros(2)}, "weight": 30.0}, "NaN"),
        ({"weights": 1}, "unreadable"),
    ],
)
def test_a_manifest_forged_to_match_a_bad_file_does_not_make_it_used(tmp_path, caplog, saved, why):
    entry = written_entry(tmp_path)
    forge(entry, 1, saved)
    with caplog.at_level(logging.WARNING):
        assert entry.read(LIKE, check_shapes=True) is None
    assert "client_1.pt" in caplog.text and why in caplog.text


def test_an_entry_without_a_manifest_or_of_another_job_is_retrained(tmp_path, caplog):
    entry = written_entry(tmp_path)
    manifest = json.loads((entry.folder / MANIFEST).read_text())
    (entry.folder / MANIFEST).write_text(json.dumps({**manifest, "key": {**manifest["key"], "seed": 1}}))
    assert entry.read(LIKE, check_shapes=True) is None
    (entry.folder / MANIFEST).unlink()  # an interrupted write, or an entry of an older raysim
    assert entry.read(LIKE, check_shapes=True) is None
    assert "another job" in caplog.text and "no manifest.json" in caplog.text


def test_an_entry_never_written_is_a_plain_miss(tmp_path, caplog):
    entry = CacheEntry.open(str(tmp_path / "cache"), INFO, LocalTrainConfig(), np.arange(2))
    assert entry.read(LIKE, check_shapes=True) is None and caplog.text == ""
