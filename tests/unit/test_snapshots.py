"""A client-state snapshot lists the files it froze (its manifest, bound to its checkpoint): a
resume refuses a snapshot missing a file, holding one it did not freeze, or holding one changed
since, naming the snapshot, the file and the fix; a snapshot older than manifests resumes as before."""

import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from raysim.checkpoint import read_checkpoint, save_checkpoint, snapshot_path
from raysim.errors import CheckpointError
from raysim.runtime.client_state import ClientStateStore
from raysim.types import ServerState

CLIENTS = (3, 7, 1031)  # 7 and 1031 share a shard
FIX = r"resume from an earlier checkpoint of the run \(round_NNNNN.pt beside it\)"


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """final.pt after round 3, its snapshot holding rounds 2 and 3 of each client (the store keeps
    two versions: deleting round 3's file would resume from round 2's, silently)."""
    store = ClientStateStore(tmp_path / "client_state")
    for client in CLIENTS:
        for round_num in (2, 3):
            store.put(client, round_num, {"c": torch.full((256,), float(client * 10 + round_num))})
    path = tmp_path / "checkpoints" / "final.pt"
    snapshot = store.snapshot(snapshot_path(path, 3), 3)
    save_checkpoint(path, ServerState({"w": torch.zeros(1)}), 3, {}, str(snapshot))
    assert read_checkpoint(path).state_dir == str(snapshot)  # intact: resumes
    return path


def snapshot_of(checkpoint: Path) -> Path:
    return snapshot_path(checkpoint, 3)


def refused(checkpoint: Path, *pieces: str) -> str:
    """The one line a resume of ``checkpoint`` refuses with; it holds each of ``pieces``."""
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(checkpoint)
    said = str(caught.value)
    assert "\n" not in said
    for piece in pieces:
        assert piece in said, f"{piece!r} not in {said!r}"
    return said


def test_a_missing_client_file_is_refused_naming_the_snapshot_the_file_and_the_fix(checkpoint):
    missing = snapshot_of(checkpoint) / "0007" / "7" / "3.pt"
    missing.unlink()  # client 7 would resume from its round-2 state
    said = refused(checkpoint, str(snapshot_of(checkpoint)), "0007/7/3.pt", "missing")
    assert re.search(FIX, said)


def test_a_missing_client_folder_is_refused_naming_a_file_of_it(checkpoint):
    shutil.rmtree(snapshot_of(checkpoint) / "0007" / "7")  # client 7 would start from scratch
    refused(checkpoint, str(snapshot_of(checkpoint)), "0007/7/", "missing", "earlier checkpoint")


def test_a_whole_shard_missing_is_refused(checkpoint):
    shutil.rmtree(snapshot_of(checkpoint) / "0007")  # clients 7 and 1031: a partial copy
    refused(checkpoint, "0007/", "missing", "3 more")


def test_a_truncated_client_file_is_refused_by_its_recorded_size(checkpoint):
    """A truncated archive was refused before too (unreadable); now the manifest says how."""
    file = snapshot_of(checkpoint) / "0003" / "3" / "3.pt"
    size = file.stat().st_size
    with file.open("r+b") as out:
        out.truncate(size // 2)
    refused(checkpoint, "0003/3/3.pt", f"{size // 2} bytes", f"recorded {size}", "earlier checkpoint")


def test_a_file_swapped_for_another_valid_one_is_refused(checkpoint):
    """Client 3's file copied over client 7's: the same size and valid CRCs, but not what was frozen."""
    snapshot = snapshot_of(checkpoint)
    shutil.copyfile(snapshot / "0003" / "3" / "3.pt", snapshot / "0007" / "7" / "3.pt")
    refused(checkpoint, "0007/7/3.pt", "not the file", "earlier checkpoint")


def test_a_client_file_it_did_not_freeze_is_refused_and_other_strays_are_ignored(checkpoint):
    """A .pt file the manifest does not list would be restored as a client's state; other files
    (a .DS_Store, a note, an AppleDouble ``._3.pt``) are read by nothing and do not matter."""
    snapshot = snapshot_of(checkpoint)
    (snapshot / ".DS_Store").write_bytes(b"\0")
    (snapshot / "NOTES.txt").write_text("copied from the cluster\n")
    (snapshot / "0003" / "3" / "._3.pt").write_bytes(b"\0")
    assert read_checkpoint(checkpoint).round_num == 3
    stray = snapshot / "0005" / "5" / "3.pt"
    stray.parent.mkdir(parents=True)
    shutil.copyfile(snapshot / "0003" / "3" / "3.pt", stray)  # client 5 had no state
    refused(checkpoint, "0005/5/3.pt", "not in its manifest", "delete it")


def test_a_snapshot_whose_manifest_is_missing_is_refused(checkpoint):
    (snapshot_of(checkpoint) / "manifest").unlink()
    refused(checkpoint, str(snapshot_of(checkpoint) / "manifest"), "missing", "earlier checkpoint")


@pytest.mark.parametrize("damage", ["torn", "a line dropped"])
def test_a_torn_or_edited_manifest_is_refused(checkpoint, damage):
    manifest = snapshot_of(checkpoint) / "manifest"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2] if damage == "torn" else "".join(text.splitlines(True)[:-1]))
    refused(checkpoint, str(manifest), "does not match", "earlier checkpoint")


def test_the_manifest_stays_true_while_the_live_store_goes_on(tmp_path, checkpoint):
    """Hard links: the live store writes new files and unlinks old names, never the frozen files."""
    store = ClientStateStore(tmp_path / "client_state")
    for round_num in (4, 5):  # prunes rounds 2 and 3 in the live store
        for client in CLIENTS:
            store.put(client, round_num, {"c": torch.full((256,), float(round_num))})
    assert read_checkpoint(checkpoint).round_num == 3
    resumed = ClientStateStore(tmp_path / "resumed")  # a resume links the same files again
    resumed.restore(read_checkpoint(checkpoint).state_dir)
    resumed.put(7, 4, {"c": torch.zeros(256)})
    assert read_checkpoint(checkpoint).round_num == 3


def test_a_snapshot_written_before_manifests_resumes_as_before_and_says_so(checkpoint, caplog):
    """An older raysim wrote no manifest and its checkpoint records none: resumed, with a warning
    that a missing file cannot be told; a changed byte is still refused by the files' CRCs."""
    snapshot = snapshot_of(checkpoint)
    (snapshot / "manifest").unlink()
    save_checkpoint(checkpoint, ServerState({"w": torch.zeros(1)}), 3, {}, str(snapshot))  # records none
    with caplog.at_level(logging.WARNING, logger="raysim"):
        assert read_checkpoint(checkpoint).round_num == 3
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert str(snapshot) in warning and "no manifest" in warning
    file = snapshot / "0007" / "7" / "3.pt"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))
    refused(checkpoint, str(file), "is corrupt")
