"""Client state: versions by round, retries see the pre-round state, snapshots freeze a round."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.errors import DataError
from raysim.runtime.client_state import ClientStateStore, migrate


def value(store, client, before):
    state = store.get(client, before_round=before)
    return None if state is None else state["v"].item()


def test_get_returns_newest_state_before_the_round(tmp_path):
    store = ClientStateStore(tmp_path)
    assert store.get(7, before_round=0) is None
    store.put(7, 0, {"v": torch.tensor(1.0)})
    store.put(7, 3, {"v": torch.tensor(2.0)})
    assert value(store, 7, 3) == 1.0 and value(store, 7, 4) == 2.0


@pytest.mark.parametrize("last", [3, 4])  # same parity and other parity as the retried round 5
def test_a_retried_round_reads_the_state_from_before_it(tmp_path, last):
    store = ClientStateStore(tmp_path)
    store.put(1, last, {"v": torch.tensor(float(last))})
    store.put(1, 5, {"v": torch.tensor(5.0)})  # a failed first attempt of round 5 wrote
    assert value(store, 1, 5) == float(last)  # the retry still sees the earlier state
    store.put(1, 5, {"v": torch.tensor(5.5)})  # the retry writes again
    assert value(store, 1, 6) == 5.5


def test_only_two_versions_are_kept(tmp_path):
    store = ClientStateStore(tmp_path)
    for r in (1, 4, 6, 9):
        store.put(2, r, {"v": torch.tensor(float(r))})
    assert sorted(p.name for p in tmp_path.rglob("*.pt")) == ["6.pt", "9.pt"]


def test_a_snapshot_freezes_the_state_as_of_its_round(tmp_path):
    store = ClientStateStore(tmp_path / "live")
    store.put(1, 2, {"v": torch.tensor(2.0)})
    store.put(2, 3, {"v": torch.tensor(3.0)})
    snap = store.snapshot(tmp_path / "snap", up_to_round=2)
    store.put(1, 5, {"v": torch.tensor(5.0)})  # later rounds do not leak into the snapshot
    store.put(1, 7, {"v": torch.tensor(7.0)})  # prunes round 2 in the live store
    branch = ClientStateStore(tmp_path / "branch")
    branch.restore(snap)
    assert value(branch, 1, 99) == 2.0 and value(branch, 2, 99) is None
    assert value(store, 1, 99) == 7.0


def test_a_snapshot_lists_every_file_it_froze_with_its_size_in_its_manifest(tmp_path):
    """The manifest (written last, inside the snapshot) names each frozen file, and only those."""
    store = ClientStateStore(tmp_path / "live")
    store.put(1, 2, {"v": torch.tensor(2.0)})
    store.put(1, 3, {"v": torch.arange(9.0)})
    store.put(1030, 3, {"v": torch.tensor(3.0)})
    store.put(2, 4, {"v": torch.tensor(4.0)})  # after the round: not frozen
    snap = store.snapshot(tmp_path / "snap", up_to_round=3)
    header, *lines = (snap / "manifest").read_text().splitlines()
    listed = {line.split(" ", 2)[2]: int(line.split(" ", 2)[0]) for line in lines}
    frozen = {str(p.relative_to(snap)): p.stat().st_size for p in snap.rglob("*.pt")}
    assert header.startswith("raysim client-state snapshot manifest")
    assert listed == frozen and sorted(frozen) == ["0001/1/2.pt", "0001/1/3.pt", "0006/1030/3.pt"]
    assert sorted(p.name for p in snap.iterdir() if p.is_file()) == ["layout", "manifest", "snapshot_round"]


def test_a_snapshot_of_a_store_without_state_is_none(tmp_path):
    store = ClientStateStore(tmp_path / "live")
    assert store.snapshot(tmp_path / "snap", up_to_round=5) is None
    store.put(1, 6, {"v": torch.tensor(6.0)})
    assert store.snapshot(tmp_path / "snap", up_to_round=5) is None  # written after the round
    assert not (tmp_path / "snap").exists()


def test_state_a_weights_only_load_cannot_read_is_refused_at_once(tmp_path):
    store = ClientStateStore(tmp_path)
    with pytest.raises(TypeError, match=r"client 3's state\['c'\]\[1\] is a numpy.ndarray"):
        store.put(3, 0, {"c": [torch.zeros(1), np.zeros(2)]})
    store.put(3, 0, {"c": [torch.zeros(1), 2.0, "x", (1, 2), {4}]})  # all plain: fine
    assert store.get(3, before_round=1)["c"][2] == "x"
    assert store.num_clients() == 1


def test_state_is_saved_on_the_cpu_and_read_onto_the_callers_device(tmp_path, monkeypatch):
    """A GPU run's state must load on a CPU-only host: put moves every tensor to the CPU (spied,
    as no CUDA is here) and get maps the file to the device asked for ('meta' stands in for one)."""
    import raysim.runtime.client_state as module

    moved, real = [], module.to_cpu

    def spy(tree):
        moved.append(tree)
        return real(tree)

    monkeypatch.setattr(module, "to_cpu", spy)
    store = ClientStateStore(tmp_path)
    state = {"c": {"w": torch.ones(2)}, "step": 3}
    store.put(4, 0, state)
    assert moved == [state]
    saved = torch.load(tmp_path / "0004" / "4" / "0.pt", weights_only=True)
    assert saved["c"]["w"].device.type == "cpu" and saved["step"] == 3
    assert store.get(4, before_round=1)["c"]["w"].device.type == "cpu"
    on_meta = store.get(4, before_round=1, device="meta")
    assert on_meta["c"]["w"].device.type == "meta" and on_meta["step"] == 3


def test_a_snapshot_replaces_the_one_already_at_its_place(tmp_path):
    """A continued run writes its final.pt again: the new snapshot holds the new rounds only, even
    though the live store was restored from the old one by hard links (the same files)."""
    store = ClientStateStore(tmp_path / "live")
    store.put(1, 0, {"v": torch.tensor(0.0)})
    target = store.snapshot(tmp_path / "final.client_state", up_to_round=0)
    resumed = ClientStateStore(tmp_path / "resumed")
    resumed.restore(target)
    resumed.put(1, 1, {"v": torch.tensor(1.0)})
    resumed.put(2, 1, {"v": torch.tensor(2.0)})
    assert resumed.snapshot(target, up_to_round=1) == target
    frozen = ClientStateStore(target)
    assert value(frozen, 1, 2) == 1.0 and value(frozen, 2, 2) == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.client_state", "live", "resumed"]


def test_a_read_lists_only_the_clients_own_folder(tmp_path, monkeypatch):
    """Ten thousand clients to a shard at ten million: a read must not scan the shard."""
    store = ClientStateStore(tmp_path)
    for client in (5, 5 + 1024, 5 + 2048):  # one shard
        store.put(client, 0, {"v": torch.tensor(float(client))})
    listed = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: listed.append(Path(path)) or real(path))
    monkeypatch.setattr(Path, "glob", lambda *a: pytest.fail("a read globbed a folder"))
    assert value(store, 1029, 1) == 1029.0
    assert listed == [tmp_path / "0005" / "1029"]


def flat_layout(root, files):
    """A client-state folder as raysim wrote it before per-client folders."""
    for client, round_num, v in files:
        (root / f"{client % 1024:04d}").mkdir(parents=True, exist_ok=True)
        torch.save({"v": torch.tensor(v)}, root / f"{client % 1024:04d}" / f"{client}.{round_num}.pt")


def test_a_folder_of_the_flat_layout_is_refused_naming_the_migration(tmp_path):
    flat_layout(tmp_path, [(7, 2, 2.0)])
    with pytest.raises(DataError, match=rf"flat layout.*python -m raysim.runtime.client_state {tmp_path}"):
        ClientStateStore(tmp_path)


def test_migrate_converts_the_flat_layout_in_place(tmp_path):
    flat_layout(tmp_path, [(7, 2, 2.0), (7, 4, 4.0), (1031, 3, 3.0)])
    assert migrate(tmp_path) == 3
    store = ClientStateStore(tmp_path)
    assert value(store, 7, 4) == 2.0 and value(store, 7, 5) == 4.0 and value(store, 1031, 9) == 3.0
    assert not list(tmp_path.glob("*/*.pt"))  # no flat file left


def test_a_snapshot_of_the_flat_layout_restores_into_per_client_folders(tmp_path):
    """A checkpoint written before per-client folders resumes: restore converts as it links."""
    flat_layout(tmp_path / "snap", [(3, 1, 1.0), (3, 2, 2.0)])
    store = ClientStateStore(tmp_path / "live")
    store.restore(tmp_path / "snap")
    assert value(store, 3, 2) == 1.0 and value(store, 3, 3) == 2.0 and store.num_clients() == 1
