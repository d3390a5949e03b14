"""A round's large arrays between the driver and the workers of its own node, through shared
memory that lives as long as the run.

Why: Ray moves a worker's answer (its float64 partial, twice the model's size) and the round's
broadcast through its object store, which places every new object at fresh addresses of a store
sized to a third of the machine's memory: each round each process faults in every page it
writes or reads (about 1,600 faults and 5-8 ms for a 6.4 MB broadcast on the 2-core VM, where
the same copy into pages already mapped takes 1-2 ms), and a 12.8 MB answer took 6-9 ms from
the worker's return to the driver's ``ray.get`` against 0.7 ms for a small one. A segment the
driver creates once and both sides keep mapped is written in place round after round instead.

How: pickle protocol 5 keeps each large buffer out of band (numpy arrays offer theirs), so the
pickled bytes are small and hold everything else; the buffers are laid one after another in the
segment, and the other side unpickles against views of them. The values are the same bytes, so
a run's results do not change. A worker folds its partial's float64 sums in its answer segment
from the round's first client on (``carved``), so its answer is packed without copying them.

Who owns what. The driver creates every segment (``Segment``: its pages taken from /dev/shm at
once, so a full /dev/shm is an ``OSError`` here, never a SIGBUS on a later write) and unlinks it
at the end; a sentinel process (``raysim.runtime.sentinel``) unlinks those of a driver killed
outright (segments are named ``raysim_<driver pid>_...``). A worker maps a segment by name
(``Attached``) and never unlinks it. A segment is rewritten only by its one writer, and only
after its reader is done with it: the broadcast before a round's calls start; a worker's answer
segment during that worker's next call, which the driver makes only after merging the answer
(a re-run of a lost worker's clients in the same round is offered no segment, and answers whole).

Memory: the broadcast (the payload's size) plus, per worker on the node, its answer (a float64
partial: twice the float32 model) with a quarter more room, held for the run in /dev/shm beside
Ray's object store; where /dev/shm cannot hold them, the rounds go through the object store.

Usage:
    segments = DriverSegments()                     # the driver
    packed = segments.send(payload)                 # grown first where it does not fit
    attached = Attached()                           # a worker, once
    payload = unpack(attached.buffer(packed.segment), packed, copy=True)
    memory = carved(attached.buffer(name))          # the partial's sums folded in place
    answer = pack(attached.buffer(name), name, report)   # Packed, or Unfit: sent whole
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import torch

from raysim.aggregate import Memory
from raysim.runtime.sentinel import Sentinel

_IN_BAND_BYTES = 1 << 16  # smaller buffers stay in the pickled bytes: not worth a span
_ALIGN = 64  # each buffer starts on a cache line (and any dtype's alignment)

Dumps = Callable[..., bytes]  # pickle.dumps's signature; Ray's cloudpickle where plugins' types travel


@dataclass(frozen=True)
class Packed:
    """An object pickled with its large buffers in a segment; ``data`` holds the rest."""

    data: bytes
    segment: str  # the segment's name
    spans: tuple[tuple[int, int], ...]  # (offset, bytes) of each out-of-band buffer, in order


@dataclass(frozen=True)
class Unfit:
    """An answer that did not fit its segment, sent whole, and the bytes its buffers need."""

    value: Any
    needed: int


def pack(buffer: memoryview, segment: str, value: Any, dumps: Dumps = pickle.dumps) -> Packed | Unfit:
    """``value`` pickled with its buffers of 64 KiB or more in ``buffer`` (the mapped ``segment``):
    those that already lie in it (a partial folded there, ``carved``) where they are, the others
    written after them; ``Unfit`` with the bytes they need where they do not fit."""
    large: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < _IN_BAND_BYTES:
            return True  # in band
        large.append(view)
        return False

    data = dumps(value, protocol=5, buffer_callback=out_of_band)
    base = _address(buffer)
    at = [_address(view) - base for view in large]
    in_place = [0 <= offset <= buffer.nbytes - view.nbytes for offset, view in zip(at, large)]
    end = max((o + v.nbytes for o, v, here in zip(at, large, in_place) if here), default=0)
    spans, copies = [], []
    for offset, view, here in zip(at, large, in_place):
        if not here:
            offset = _aligned(end)
            end = offset + view.nbytes
            copies.append((offset, view))
        spans.append((offset, view.nbytes))
    if end > buffer.nbytes:
        return Unfit(value, end)
    for offset, view in copies:
        buffer[offset : offset + view.nbytes] = view
    return Packed(data, segment, tuple(spans))


def carved(buffer: memoryview) -> Memory:
    """New tensors laid one after another in ``buffer`` from its start, each on a cache line;
    None for one that does not fit, or that is small enough to travel in the pickled bytes (it
    is made in the process's own memory; ``pack`` copies a large one). A worker's partial folded
    into its answer segment so is sent without a copy (``raysim.aggregate.placed``)."""
    used = 0

    def tensor(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor | None:
        nonlocal used
        count = math.prod(shape)
        size = count * dtype.itemsize
        if size < _IN_BAND_BYTES or used + size > buffer.nbytes:
            return None
        out = torch.frombuffer(buffer, dtype=dtype, count=count, offset=used).view(shape)
        used = _aligned(used + size)
        return out

    return tensor


def unpack(buffer: memoryview, packed: Packed, copy: bool) -> Any:
    """The packed value; its arrays view ``buffer`` read-only, or are the reader's own with
    ``copy`` (a worker keeps nothing that the next round's broadcast would overwrite)."""
    views = [buffer[offset : offset + size] for offset, size in packed.spans]
    buffers = [bytearray(view) for view in views] if copy else [view.toreadonly() for view in views]
    return pickle.loads(packed.data, buffers=buffers)


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _address(view: memoryview) -> int:
    """Where a contiguous buffer's first byte lies in this process's memory."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class Segment:
    """A shared-memory segment the driver creates and unlinks; ``grown`` replaces it by a larger
    one (a new name, which the readers map anew)."""

    def __init__(self, size: int) -> None:
        """Raises:
        OSError: /dev/shm cannot hold ``size`` bytes (nothing is left behind)."""
        name = f"{segment_prefix(os.getpid())}{secrets.token_hex(6)}"
        self._memory = shared_memory.SharedMemory(name=name, create=True, size=max(size, _ALIGN))
        _CREATED.add(self._memory.name)
        allocate = getattr(os, "posix_fallocate", None)  # Linux; tmpfs pages are taken now
        if allocate is not None:
            try:
                allocate(self._memory._fd, 0, self._memory.size)  # type: ignore[attr-defined]
            except OSError:
                self.close()
                raise

    @property
    def name(self) -> str:
        return self._memory.name

    @property
    def buffer(self) -> memoryview:
        return _whole(self._memory)

    def fits(self, size: int) -> bool:
        return size <= self._memory.size

    def grown(self, size: int) -> Segment:
        """This segment, or a new one of at least ``size`` bytes (this one unlinked)."""
        if self.fits(size):
            return self
        self.close()
        return Segment(size + size // 4)  # room for a plugin whose payload grows a little

    def close(self) -> None:
        """Unlinks the segment; its memory is freed once no process maps it."""
        with contextlib.suppress(FileNotFoundError):
            self._memory.unlink()
        _unmap(self._memory)


class Attached:
    """A worker's mappings of the driver's segments, by name; a segment no longer named is
    dropped when the next one is mapped."""

    def __init__(self) -> None:
        self._mapped: dict[str, shared_memory.SharedMemory] = {}

    def buffer(self, name: str) -> memoryview:
        """The named segment's memory.

        Raises:
            FileNotFoundError: no such segment on this machine (another node's, or gone).
        """
        if name not in self._mapped:
            self._mapped[name] = _attach(name)
        return _whole(self._mapped[name])

    def keep_only(self, names: set[str]) -> None:
        """Unmaps the segments not in ``names`` (replaced by larger ones)."""
        for name in set(self._mapped) - names:
            _unmap(self._mapped.pop(name))


_LINGERING: list[shared_memory.SharedMemory] = []  # still viewed when closed; unmapped once not


def _unmap(memory: shared_memory.SharedMemory) -> None:
    """Unmaps ``memory`` and any segment left mapped earlier whose arrays are gone since. One an
    array still views stays mapped (closing it would pull the pages from under the array), and
    is kept here so that its finalizer does not try again at an arbitrary moment."""
    for held in [*_LINGERING, memory]:
        try:
            held.close()
        except BufferError:
            if held not in _LINGERING:
                _LINGERING.append(held)
        else:
            if held in _LINGERING:
                _LINGERING.remove(held)


def _whole(memory: shared_memory.SharedMemory) -> memoryview:
    """A view of the whole segment (``buf`` is None only after ``close``)."""
    assert memory.buf is not None, "a segment is read only while mapped"
    return memoryview(memory.buf)


_CREATED: set[str] = set()  # segments this process created (and its resource tracker unlinks)


def segment_prefix(pid: int) -> str:
    """The names of driver ``pid``'s segments begin so (what its sentinel unlinks)."""
    return f"raysim_{pid}_"


def _attach(name: str) -> shared_memory.SharedMemory:
    """The segment mapped, without registering it with this process's resource tracker, which
    would unlink the driver's segment when this worker exits (Python before 3.13 registers every
    attach; 3.13 has ``track=False``). The process that created it keeps its registration."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        memory = shared_memory.SharedMemory(name=name)
        if name not in _CREATED:
            resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
        return memory


class DriverSegments:
    """The driver's segments: one broadcast that every worker of its node reads, and an answer
    segment per such worker, each grown to what the last round needed; and the sentinel that
    unlinks them if the driver is killed outright. Both come at first use: a driver whose
    workers all run on other nodes creates neither.

    Raises (``send``): OSError where /dev/shm cannot hold the broadcast."""

    def __init__(self) -> None:
        self.sentinel: Sentinel | None = None
        self._broadcast: Segment | None = None
        self.answers: dict[int, Segment] = {}
        self.no_room: set[int] = set()  # workers whose answers /dev/shm could not hold

    def _new(self) -> Segment:
        """A new, empty segment; the sentinel is started before the first one."""
        if self.sentinel is None:
            self.sentinel = Sentinel.start("unlink-segments", segment_prefix(os.getpid()))
        return Segment(0)

    @property
    def broadcast(self) -> Segment:
        if self._broadcast is None:
            self._broadcast = self._new()
        return self._broadcast

    def send(self, value: Any, dumps: Dumps = pickle.dumps) -> Packed:
        """``value`` packed into the broadcast segment, grown first where it does not fit."""
        packed = pack(self.broadcast.buffer, self.broadcast.name, value, dumps)
        if isinstance(packed, Unfit):
            self._broadcast = self.broadcast.grown(packed.needed)
            packed = pack(self.broadcast.buffer, self.broadcast.name, value, dumps)
        assert isinstance(packed, Packed), "a segment grown to the size needed holds it"
        return packed

    def answer_segment(self, worker: int) -> str | None:
        """The name of the segment worker ``worker`` writes its answer into; None where /dev/shm
        could not hold it (the worker answers whole, through Ray)."""
        if worker in self.no_room:
            return None
        if worker not in self.answers:
            self.answers[worker] = self._new()
        return self.answers[worker].name

    def received(self, worker: int, answer: Any) -> Any:
        """The worker's answer: read in place from its segment (valid until its next call), or
        sent whole, its segment then grown for the next round."""
        if isinstance(answer, Packed):
            assert answer.segment == self.answers[worker].name, "an answer is read where it was written"
            return unpack(self.answers[worker].buffer, answer, copy=False)
        if isinstance(answer, Unfit):
            self._grow_answer(worker, answer.needed)
            return answer.value
        return answer

    def _grow_answer(self, worker: int, size: int) -> None:
        try:
            self.answers[worker] = self.answers[worker].grown(size)
        except OSError:  # /dev/shm is full: this worker answers through Ray from now on
            self.answers.pop(worker).close()
            self.no_room.add(worker)

    def close(self) -> None:
        """Unlinks every segment and stands the sentinel down."""
        for segment in self.answers.values():
            segment.close()
        if self._broadcast is not None:
            self._broadcast.close()
        if self.sentinel is not None:
            self.sentinel.stand_down()
