"""Client data on a cluster: a store is recognised by its fingerprint, shipped copies land once per
node, and a node that cannot read the data gets an error naming the node, the path and the fix.

The object store is stood in for by copies in memory (``put``) and identity (``get``).
"""

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.errors import ResourceError
from raysim.runtime.client_state import ClientStateStore
from raysim.runtime.shipping import (
    DataPlan,
    NodeLocalStateStore,
    NodeView,
    fingerprint,
    local_copy,
    shipped_root,
    stores_to_ship,
    why_unseen,
)
from raysim.runtime.wire import WorkerSetup


def put(array):
    return np.array(array)  # a copy: the object store holds the bytes, not the file


def get(obj):
    return obj


def make_store(path: Path, rows: bytes = b"rows-bytes", hash_: str = "abc") -> Path:
    path.mkdir(parents=True)
    (path / "rows.arrow").write_bytes(rows)
    (path / "clients.parquet").write_bytes(b"")
    (path / "tokenizer").mkdir()
    (path / "tokenizer" / "vocab.json").write_text("{}")
    (path / "meta.json").write_text(json.dumps({"content_hash": hash_}))
    return path


@pytest.fixture
def node_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "node-cache"))
    return shipped_root()


def plan_for(tmp_path, mode="auto", transfer=False):
    store = make_store(tmp_path / "store")
    transfer_stores = {"ood": str(make_store(tmp_path / "ood", hash_="def"))} if transfer else {}
    setup = WorkerSetup(job={}, store_path=str(store), state_dir=str(tmp_path / "state"),
                        transfer_stores=transfer_stores)  # fmt: skip
    return setup, DataPlan.of(setup, mode)


def test_a_fingerprint_follows_the_content_not_the_path(tmp_path):
    a = fingerprint(make_store(tmp_path / "a"))
    assert fingerprint(make_store(tmp_path / "b")) == a
    assert fingerprint(make_store(tmp_path / "c", hash_="other")) != a  # meta.json differs
    assert fingerprint(make_store(tmp_path / "d", rows=b"rows-bytes, half copied")) != a  # a size
    with pytest.raises(OSError):
        fingerprint(tmp_path / "nowhere")


def test_why_a_node_cannot_use_a_path(tmp_path):
    expected = fingerprint(make_store(tmp_path / "a"))
    assert why_unseen(tmp_path / "a", expected) is None
    assert "no such directory" in why_unseen(tmp_path / "missing", expected)
    assert "other data" in why_unseen(make_store(tmp_path / "old", hash_="old"), expected)


def test_a_node_that_reads_the_store_opens_the_drivers_path(tmp_path, node_cache):
    setup, plan = plan_for(tmp_path, transfer=True)
    shipped = plan.ship(["ood"], put)  # another node could not read the transfer store
    resolved = shipped.resolve(setup, get, node="n1")
    assert resolved.store_path == setup.store_path
    assert resolved.transfer_stores == setup.transfer_stores  # this node reads it: no copy
    assert not node_cache.exists()


def test_a_shipped_store_is_copied_once_per_node_and_opened_there(tmp_path, node_cache):
    setup, plan = plan_for(tmp_path, transfer=True)
    expected = plan.stores[""].fingerprint
    shipped = plan.ship(["", "ood"], put)
    Path(setup.store_path).rename(tmp_path / "moved")  # this node cannot see the driver's path
    resolved = shipped.resolve(setup, get, node="n1")
    assert resolved.store_path == str(node_cache / expected)
    assert fingerprint(resolved.store_path) == expected  # nested files and empty ones too
    assert resolved.transfer_stores == {"ood": setup.transfer_stores["ood"]}
    fetched = []
    again = shipped.resolve(setup, lambda obj: fetched.append(obj) or obj, node="n1")
    assert again == resolved and not fetched  # a later worker on the node reuses the copy


def test_always_ships_to_nodes_that_could_read_the_store(tmp_path, node_cache):
    setup, plan = plan_for(tmp_path, mode="always")
    shipped = plan.ship(stores_to_ship(plan, []), put)
    assert shipped.resolve(setup, get, node="n1").store_path == str(node_cache / plan.stores[""].fingerprint)


def test_two_workers_of_a_node_copy_at_once_without_clashing(tmp_path, node_cache):
    _, plan = plan_for(tmp_path)
    ref = plan.ship([""], put).stores[""]
    barrier, started = threading.Barrier(4, timeout=10), threading.local()
    paths = []

    def racing_get(obj):
        if not getattr(started, "copying", False):  # every worker is writing before any renames
            started.copying = True
            barrier.wait()
        return obj

    threads = [
        threading.Thread(target=lambda: paths.append(local_copy(ref, racing_get, node_cache)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(paths) == 4 and len(set(paths)) == 1
    assert fingerprint(paths[0]) == ref.fingerprint
    assert [p.name for p in node_cache.iterdir()] == [ref.fingerprint]  # no partial copy left


def test_a_damaged_copy_is_replaced(tmp_path, node_cache):
    _, plan = plan_for(tmp_path)
    ref = plan.ship([""], put).stores[""]
    target = local_copy(ref, get, node_cache)
    (target / "rows.arrow").write_bytes(b"truncated")
    assert fingerprint(local_copy(ref, get, node_cache)) == ref.fingerprint


@pytest.mark.parametrize(("mode", "fix"), [("auto", "ship_data=always"), ("never", "ship_data=auto")])
def test_a_node_that_cannot_read_an_unshipped_store_is_told_the_node_path_and_fix(tmp_path, mode, fix):
    setup, plan = plan_for(tmp_path, mode=mode)
    Path(setup.store_path).rename(tmp_path / "moved")
    with pytest.raises(ResourceError) as info:
        plan.resolve(setup, get, node="gpu-7 (10.0.0.7)")
    message = str(info.value)
    assert "gpu-7 (10.0.0.7)" in message and setup.store_path in message and "no such directory" in message
    assert f"resources.{fix}" in message and "mounts at the same path" in message


def test_which_stores_ship(tmp_path):
    _, plan = plan_for(tmp_path, transfer=True)
    blind = NodeView("n2", {"ood": "no such directory there"})
    assert stores_to_ship(plan, [NodeView("n1"), blind]) == ["ood"]
    assert stores_to_ship(plan, [NodeView("n1")]) == []
    never = DataPlan(plan.stores, plan.state_dir, plan.state_token, "never")
    with pytest.raises(ResourceError, match=r"node n2 cannot read .*\(transfer store 'ood' "):
        stores_to_ship(never, [NodeView("n1"), blind])
    always = DataPlan(plan.stores, plan.state_dir, plan.state_token, "always")
    assert stores_to_ship(always, []) == ["", "ood"]


def test_a_node_that_does_not_see_the_state_directory_refuses_to_keep_state(tmp_path):
    setup, plan = plan_for(tmp_path)
    assert plan.sees_state() and type(plan.state_store("n1")) is ClientStateStore
    other_node = DataPlan(plan.stores, str(tmp_path / "elsewhere"), plan.state_token)  # no driver's mark
    assert not other_node.sees_state()
    states = other_node.state_store("n2")
    assert isinstance(states, NodeLocalStateStore) and states.get(3, before_round=1) is None
    with pytest.raises(ResourceError, match=r"node n2 cannot see .* \(raysim run --output-dir\)"):
        states.put(3, 0, {"c": torch.zeros(2)})


def test_a_resumed_runs_state_must_be_visible_on_every_node(tmp_path):
    state_dir = tmp_path / "state"
    ClientStateStore(state_dir).put(3, 0, {"c": torch.zeros(2)})  # restored from a checkpoint
    setup = WorkerSetup(job={}, store_path=str(make_store(tmp_path / "store")), state_dir=str(state_dir))
    plan = DataPlan.of(setup, "auto")
    assert plan.resumes_state
    with pytest.raises(ResourceError, match="node n2 cannot see .* the state this run resumes from"):
        stores_to_ship(plan, [NodeView("n1"), NodeView("n2", sees_state=False)])
    elsewhere = DataPlan(plan.stores, str(tmp_path / "elsewhere"), plan.state_token, resumes_state=True)
    with pytest.raises(ResourceError, match="resumes from"):
        elsewhere.state_store("n2")
