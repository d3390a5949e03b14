"""Client data on a cluster: each worker reads the driver's store where its node holds the same
files, else a copy shipped through Ray's object store into a cache on its node.

A store is recognised by its fingerprint (its ``meta.json``, which records the data files'
content hash, plus the name and size of every file), never by its path alone: an old or half-copied
store at the same path on another node is not the driver's store. Client state is written by
workers and read by whichever worker trains the client next and by the driver's checkpoints, so it
cannot be shipped once: its directory must be shared, and a worker whose node does not see it
refuses to keep state (``NodeLocalStateStore``).

Ray stays in ``ray_backend.py``: what needs the object store takes its ``put`` / ``get`` here.

Usage (what ``RayBackend`` does):
    plan = DataPlan.of(setup, "auto")                  # driver: fingerprints, a state-dir mark
    views = [node_view(plan, node) for each node]      # on each node (a Ray task)
    plan = plan.ship(stores_to_ship(plan, views), ray.put)
    setup = plan.resolve(setup, ray.get, node)         # on each worker: paths it can open
    states = plan.state_store(node)                    # on each worker
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from raysim.data.format import META_FILE
from raysim.errors import ResourceError
from raysim.runtime.client_state import ClientStateStore
from raysim.runtime.wire import WorkerSetup

ShipMode = Literal["auto", "always", "never"]
STATE_MARK = ".driver"  # in the client-state directory: a token only the driver's directory holds
SHARED_STORAGE = "storage every node mounts at the same path (NFS, a cluster file system)"


def fingerprint(path: str | Path) -> str:
    """A digest of the store in ``path``: its ``meta.json`` and every file's name and size.

    Raises:
        OSError: there is no readable store there.
    """
    root = Path(path)
    digest = hashlib.blake2b((root / META_FILE).read_bytes(), digest_size=16)
    for name, size in sorted((name, (root / name).stat().st_size) for name in store_files(root)):
        digest.update(f"{name}\0{size}\n".encode())
    return digest.hexdigest()


def store_files(root: Path) -> list[str]:
    """Every file of the store, as a path relative to its folder (a tokenizer folder included)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def why_unseen(path: str | Path, expected: str) -> str | None:
    """None when ``path`` holds the store with fingerprint ``expected``; else why it does not."""
    if not Path(path).is_dir():
        return "no such directory there"
    try:
        found = fingerprint(path)
    except OSError as exc:
        return f"it is unreadable there ({exc})"
    return None if found == expected else "it holds other data there (another meta.json or other files)"


def shipped_root() -> Path:
    """The node-local folder of shipped stores: $RAYSIM_CACHE/shipped, else ~/.cache/raysim/shipped
    (read on the worker's node)."""
    return Path(os.environ.get("RAYSIM_CACHE") or Path.home() / ".cache" / "raysim") / "shipped"


@dataclass(frozen=True)
class StoreRef:
    """One store as the driver sees it; ``files`` (relative path -> object-store reference of its
    bytes) once it is shipped."""

    path: str
    fingerprint: str
    files: dict[str, Any] | None = None


@dataclass(frozen=True)
class NodeView:
    """What one node sees of the driver's files (``node_view``)."""

    node: str
    unseen: dict[str, str] = field(default_factory=dict)  # store name -> why this node cannot use it
    sees_state: bool = True


@dataclass(frozen=True)
class DataPlan:
    """Where every worker finds the job's stores ("" the training store, transfer stores by name)
    and how it recognises the driver's client-state directory."""

    stores: dict[str, StoreRef]
    state_dir: str
    state_token: str
    mode: ShipMode = "auto"
    resumes_state: bool = False  # the state directory starts with a checkpoint's client state

    @classmethod
    def of(cls, setup: WorkerSetup, mode: ShipMode) -> DataPlan:
        """The driver's plan: each store's fingerprint; marks the state directory as the driver's."""
        paths = {"": setup.store_path} | setup.transfer_stores
        stores = {name: StoreRef(path, fingerprint(path)) for name, path in paths.items()}
        token, states = uuid.uuid4().hex, ClientStateStore(setup.state_dir)
        (states.root / STATE_MARK).write_text(token)
        return cls(stores, setup.state_dir, token, mode, resumes_state=states.num_clients() > 0)

    def ship(self, names: Iterable[str], put: Callable[[Any], Any]) -> DataPlan:
        """The plan with stores ``names`` in the object store, each file put once."""
        shipped = dict(self.stores)
        for name in names:
            ref = self.stores[name]
            root = Path(ref.path)
            shipped[name] = replace(ref, files={f: put(read_bytes(root / f)) for f in store_files(root)})
        return replace(self, stores=shipped)

    def sees_state(self) -> bool:
        """Whether this node's ``state_dir`` is the driver's (it holds the driver's token)."""
        try:
            return (Path(self.state_dir) / STATE_MARK).read_text() == self.state_token
        except OSError:
            return False

    def state_store(self, node: str) -> ClientStateStore:
        """The client-state store a worker on ``node`` uses: the driver's directory where the node
        sees it, else one that refuses to keep state (``NodeLocalStateStore``).

        Raises:
            ResourceError: the node cannot see the state this run resumes from.
        """
        if self.sees_state():
            return ClientStateStore(self.state_dir)
        if self.resumes_state:
            raise ResourceError(blind_to_state(node, self.state_dir))
        return NodeLocalStateStore(self.state_dir, node)

    def resolve(self, setup: WorkerSetup, get: Callable[[Any], Any], node: str) -> WorkerSetup:
        """``setup`` with the paths this node opens: the driver's where it holds the same store
        (unless every store is shipped, ``always``), else the shipped copy in ``shipped_root()``.

        Raises:
            ResourceError: the node cannot read a store that was not shipped.
        """
        paths = {name: self._local_path(name, get, node) for name in self.stores}
        transfer = {name: paths[name] for name in setup.transfer_stores}
        return replace(setup, store_path=paths[""], transfer_stores=transfer)

    def _local_path(self, name: str, get: Callable[[Any], Any], node: str) -> str:
        ref = self.stores[name]
        unseen = why_unseen(ref.path, ref.fingerprint)
        if ref.files is not None and (unseen is not None or self.mode == "always"):
            return str(local_copy(ref, get, shipped_root()))
        if unseen is not None:
            raise ResourceError(unreachable(node, {name: unseen}, self, self.mode))
        return ref.path


def read_bytes(path: Path) -> np.ndarray:
    """A file's bytes as a uint8 array, memory-mapped: putting it copies the file once."""
    if path.stat().st_size == 0:
        return np.empty(0, np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def local_copy(ref: StoreRef, get: Callable[[Any], Any], root: Path) -> Path:
    """The shipped store in ``root/<fingerprint>``, written there unless a worker on this node did.

    The copy is written to a private folder and renamed into place, so two workers on one node
    never see each other's half-written files; the loser of a race uses the winner's copy.
    """
    if ref.files is None:
        raise ValueError(f"store {ref.path} was not shipped")
    target = root / ref.fingerprint
    if why_unseen(target, ref.fingerprint) is None:
        return target
    if target.exists() and why_unseen(target, ref.fingerprint) is not None:  # damaged, not half-landed
        damaged = root / f".{ref.fingerprint}.damaged.{uuid.uuid4().hex}"
        target.rename(damaged)
        shutil.rmtree(damaged, ignore_errors=True)
    partial = root / f".{ref.fingerprint}.{uuid.uuid4().hex}"
    for name, obj in ref.files.items():
        dest = partial / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(np.asarray(get(obj), np.uint8).data)
    try:
        partial.rename(target)
    except OSError:  # another worker on this node renamed its copy first
        shutil.rmtree(partial, ignore_errors=True)
    if (problem := why_unseen(target, ref.fingerprint)) is not None:
        raise ResourceError(f"the shipped copy of {ref.path} at {target} is damaged: {problem}")
    return target


def node_view(plan: DataPlan, node: str) -> NodeView:
    """What this node sees of the plan's stores and of its state directory (run on the node)."""
    unseen = {name: why_unseen(ref.path, ref.fingerprint) for name, ref in plan.stores.items()}
    return NodeView(node, {name: why for name, why in unseen.items() if why}, plan.sees_state())


def stores_to_ship(plan: DataPlan, views: list[NodeView]) -> list[str]:
    """The stores to put in the object store, by ``plan.mode``.

    Raises:
        ResourceError: ``never`` and a node cannot read a store; or the run starts from restored
            client state (a resume) that a node cannot see.
    """
    blind = [view.node for view in views if not view.sees_state]
    if plan.resumes_state and blind:
        raise ResourceError(blind_to_state(blind[0], plan.state_dir))
    if plan.mode == "always":
        return list(plan.stores)
    unseen = {name: why for view in views for name, why in view.unseen.items()}
    if unseen and plan.mode == "never":
        view = next(view for view in views if view.unseen)
        raise ResourceError(unreachable(view.node, view.unseen, plan, "never"))
    return [name for name in plan.stores if name in unseen]


def unreachable(node: str, unseen: dict[str, str], plan: DataPlan, mode: ShipMode) -> str:
    """Which stores ``node`` cannot read, and the two ways to fix it."""
    what = "; ".join(
        f"{'the client store' if not name else f'transfer store {name!r}'} {plan.stores[name].path}: {why}"
        for name, why in unseen.items()
    )
    ship = "ship_data=auto" if mode == "never" else "ship_data=always"
    return (
        f"node {node} cannot read the driver's data ({what}); put the stores on {SHARED_STORAGE}, "
        f"or set resources.{ship} to send them through Ray's object store"
    )


def blind_to_state(node: str, state_dir: str) -> str:
    return (
        f"node {node} cannot see the client-state directory {state_dir}, which holds the state this "
        f"run resumes from; put the output directory (raysim run --output-dir) on {SHARED_STORAGE}"
    )


class NodeLocalStateStore(ClientStateStore):
    """The client-state store of a worker whose node does not see the driver's state directory:
    reading finds nothing (nothing was ever written there), writing is refused, since the next
    worker to train the client, and the driver's checkpoints, would never see the state."""

    def __init__(self, root: str | Path, node: str) -> None:
        super().__init__(root)
        self.node = node

    def put(self, client_id: int, round_num: int, state: Any) -> None:
        raise ResourceError(
            f"node {self.node} cannot see the driver's client-state directory {self.root}, so client "
            f"{client_id}'s state would be lost; an algorithm that keeps client state needs the output "
            f"directory (raysim run --output-dir) on {SHARED_STORAGE}"
        )
