"""Shared-memory segments: what crosses them arrives byte for byte, large buffers out of band;
views and copies behave as the reader needs; segments grow, and are unlinked by the driver only."""

import errno
import multiprocessing
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from raysim.aggregate import WeightedMean, placed
from raysim.runtime.shared_segments import (
    Attached,
    DriverSegments,
    Packed,
    Segment,
    Unfit,
    carved,
    pack,
    segment_prefix,
    unpack,
)
from raysim.types import ClientResult


@dataclass(frozen=True)
class Report:
    big: dict[str, np.ndarray]
    small: np.ndarray
    note: str


def report(seed: int = 0) -> Report:
    rng = np.random.default_rng(seed)
    big = {"w": rng.standard_normal((300, 100)), "b": rng.standard_normal(20_000).astype(np.float32)}
    return Report(big, rng.integers(0, 9, 10), "kept in band")


def same(a: Report, b: Report) -> bool:
    arrays = [(a.big[k], b.big[k]) for k in a.big] + [(a.small, b.small)]
    return a.note == b.note and all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in arrays)


def test_large_buffers_cross_out_of_band_and_arrive_byte_for_byte():
    segment = Segment(1 << 20)
    try:
        packed = pack(segment.buffer, segment.name, report())
        assert isinstance(packed, Packed)
        assert [size for _, size in packed.spans] == [300 * 100 * 8, 20_000 * 4]  # the small array in band
        assert len(packed.data) < 2_000  # the rest: structure and small values
        assert all(offset % 64 == 0 for offset, _ in packed.spans)
        assert same(unpack(segment.buffer, packed, copy=False), report())
        assert same(unpack(segment.buffer, packed, copy=True), report())
    finally:
        segment.close()


def test_views_read_the_segment_in_place_and_copies_are_the_readers_own():
    segment = Segment(1 << 20)
    try:
        packed = pack(segment.buffer, segment.name, report(0))
        assert isinstance(packed, Packed)
        view, copy = unpack(segment.buffer, packed, copy=False), unpack(segment.buffer, packed, copy=True)
        assert not view.big["w"].flags.writeable and copy.big["w"].flags.writeable
        pack(segment.buffer, segment.name, report(1))  # the writer's next round
        later, first = report(1), report(0)
        assert all(np.array_equal(view.big[k], later.big[k]) for k in later.big)  # read in place
        assert np.array_equal(view.small, first.small)  # in band: the view's own
        assert same(copy, first)
    finally:
        segment.close()


def test_what_does_not_fit_comes_back_whole_with_the_size_it_needs():
    segment = Segment(1_000)
    try:
        unfit = pack(segment.buffer, segment.name, report())
        assert isinstance(unfit, Unfit) and unfit.value is not None
        assert unfit.needed == 240_000 + 80_000  # both spans, each 64-byte aligned
        assert bytes(segment.buffer[:16]) == bytes(16)  # nothing written
    finally:
        segment.close()


def test_a_partial_read_from_a_segment_merges_to_the_same_bits():
    """Two workers' ``WeightedMean`` partials: their mean through segments equals the in-process one."""
    agg = WeightedMean()
    rng = np.random.default_rng(3)
    partials = []
    for worker in range(2):
        acc = agg.zero()
        for client in range(3):
            update = {"w": torch.from_numpy(rng.standard_normal((64, 300)).astype(np.float32))}
            acc = agg.add(acc, client, ClientResult(update, weight=float(10 + worker + client)))
        partials.append(acc)
    expected = agg.result(agg.merge(agg.merge(agg.zero(), partials[0]), partials[1]))
    segments, attached = DriverSegments(), Attached()  # the workers' side: one mapping each
    try:
        received = []
        for worker, partial in enumerate(partials):
            name = segments.answer_segment(worker)
            assert segments.answer_segment(worker) == name  # one segment per worker
            first = pack(attached.buffer(name), name, partial)
            assert isinstance(first, Unfit)  # the first round's answer is sent whole
            segments.received(worker, first)
            name = segments.answer_segment(worker)  # grown
            packed = pack(attached.buffer(name), name, partial)
            assert isinstance(packed, Packed) and packed.spans
            received.append(segments.received(worker, packed))
        merged = agg.result(agg.merge(agg.merge(agg.zero(), received[0]), received[1]))
        assert merged["w"].dtype == torch.float32 and torch.equal(merged["w"], expected["w"])
    finally:
        segments.close()


def test_carved_tensors_lie_one_after_another_on_cache_lines_until_one_does_not_fit():
    buffer = memoryview(bytearray(300_000))
    memory = carved(buffer)
    first, second = memory(torch.Size([10_001]), torch.float64), memory(torch.Size([20_000]), torch.float32)
    assert first is not None and second is not None
    assert (first.shape, first.dtype, second.shape, second.dtype) == (
        (10_001,),
        torch.float64,
        (20_000,),
        torch.float32,
    )
    base = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    assert (first.data_ptr() - base, second.data_ptr() - base) == (0, 80_064)  # 80,008 bytes, to 64
    first.fill_(2.5)
    assert np.frombuffer(buffer, dtype=np.float64, count=10_001).tolist() == [2.5] * 10_001  # the buffer
    assert memory(torch.Size([20_000]), torch.float64) is None  # 160,000 bytes from 160,064: no room
    assert memory(torch.Size([100]), torch.float64) is None  # small: it travels in the pickled bytes
    assert memory(torch.Size([8_200]), torch.float64) is not None  # a smaller large one still fits


def test_a_partial_folded_in_its_answer_segment_is_packed_where_it_lies_with_the_same_bits():
    """The worker's partial folded in place: ``pack`` records where its sums already lie (no
    copy) and writes the report's other large buffers after them, even one that comes first
    (copied to the segment's start it would overwrite the sums); the driver reads the same bits
    as the partial folded in the worker's own memory, -0.0, NaN and infinity included."""
    rng = np.random.default_rng(5)
    updates = [rng.standard_normal((128, 100)).astype(np.float32) for _ in range(3)]
    updates[0][0, :3] = [-0.0, np.nan, np.inf]
    extra = rng.standard_normal(20_000)  # 160 KB: out of band, not a partial's
    agg, segment = WeightedMean(), Segment(1 << 20)
    here = read = None
    try:
        own, here = agg.zero(), placed(agg.zero(), carved(segment.buffer))
        for i, update in enumerate(updates):
            result = ClientResult({"w": torch.from_numpy(update)}, weight=float(i + 2))
            own, here = agg.add(own, i, result), agg.add(here, i, result)
        assert here.total["w"].data_ptr() == np.frombuffer(segment.buffer, np.uint8).ctypes.data
        packed = pack(segment.buffer, segment.name, (extra, here))
        assert isinstance(packed, Packed)
        assert packed.spans == ((102_400, 160_000), (0, 128 * 100 * 8))  # the rest after the sums
        read_extra, read = unpack(segment.buffer, packed, copy=False)
        assert read.total["w"].numpy().tobytes() == own.total["w"].numpy().tobytes()
        assert read_extra.tobytes() == extra.tobytes()
        assert read.weight == own.weight == 9.0
    finally:
        del here, read
        segment.close()


def test_sums_that_fill_their_segment_to_the_last_byte_are_packed_in_place():
    """A carved tensor may end anywhere before the segment's end (no alignment after the last)."""
    segment = Segment(80_008)
    try:
        buffer = segment.buffer[:80_008]
        sums = carved(buffer)(torch.Size([10_001]), torch.float64)
        assert sums is not None
        packed = pack(buffer, segment.name, sums.numpy())
        assert isinstance(packed, Packed) and packed.spans == ((0, 80_008),)
        del sums
    finally:
        segment.close()


def test_a_partial_with_no_room_in_its_segment_is_folded_in_own_memory_and_sent_whole():
    agg, segment = WeightedMean(), Segment(1_000)
    try:
        update = {"w": torch.ones(20_000)}
        partial = agg.add(placed(agg.zero(), carved(segment.buffer)), 0, ClientResult(update, weight=2.0))
        assert partial.total["w"].tolist()[:2] == [2.0, 2.0]
        unfit = pack(segment.buffer, segment.name, partial)
        assert isinstance(unfit, Unfit) and unfit.needed == 160_000
    finally:
        segment.close()


def test_segments_and_their_sentinel_come_at_first_use():
    """A driver whose workers all run on other nodes creates no segment and starts no sentinel."""
    before = set(os.listdir("/dev/shm"))
    unused = DriverSegments()
    unused.close()
    assert unused.sentinel is None and set(os.listdir("/dev/shm")) == before
    used = DriverSegments()
    try:
        name = used.answer_segment(0)
        assert used.sentinel is not None and used.sentinel.process.poll() is None  # standing by
        assert name in set(os.listdir("/dev/shm")) - before
    finally:
        used.close()
    assert used.sentinel.process.returncode == 0 and set(os.listdir("/dev/shm")) == before


def test_a_grown_broadcast_is_a_new_segment_and_the_old_one_is_gone():
    segments, attached = DriverSegments(), Attached()
    try:
        first = segments.send({"x": np.zeros(100_000)})
        again = segments.send({"x": np.ones(100_000)})
        assert again.segment == first.segment  # fits: rewritten in place
        bigger = segments.send({"x": np.ones(400_000)})
        assert bigger.segment != first.segment
        with pytest.raises(FileNotFoundError):
            attached.buffer(first.segment)
        assert np.array_equal(
            unpack(attached.buffer(bigger.segment), bigger, copy=True)["x"], np.ones(400_000)
        )
        attached.keep_only(set())
    finally:
        segments.close()
    with pytest.raises(FileNotFoundError):
        attached.buffer(bigger.segment)


def _read_in_another_process(name: str, packed: Packed, out: "multiprocessing.Queue[float]") -> None:
    attached = Attached()
    value = unpack(attached.buffer(name), packed, copy=True)
    out.put(float(value["x"].sum()))
    attached.keep_only(set())


def test_a_worker_process_reads_the_segment_and_its_exit_leaves_it_to_the_driver():
    """The worker maps the driver's segment by name; when it exits, its resource tracker does not
    unlink the driver's segment (Python before 3.13 registers every attach)."""
    segments = DriverSegments()
    try:
        packed = segments.send({"x": np.arange(50_000, dtype=np.float64)})
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        child = context.Process(target=_read_in_another_process, args=(packed.segment, packed, out))
        child.start()
        assert out.get(timeout=60) == float(np.arange(50_000).sum())
        child.join(timeout=60)
        assert child.exitcode == 0
        attached = Attached()
        assert unpack(attached.buffer(packed.segment), packed, copy=True)["x"][-1] == 49_999
        attached.keep_only(set())
    finally:
        segments.close()


def _no_room(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="Linux: pages taken at creation")
def test_a_segment_takes_its_pages_at_once_and_a_full_dev_shm_is_an_error_leaving_nothing(monkeypatch):
    """tmpfs grows a file lazily: without taking the pages, a full /dev/shm would SIGBUS a later
    write. Here the refusal comes at creation, and the name is gone."""
    segment = Segment(1 << 20)
    try:
        assert segment.name.startswith(segment_prefix(os.getpid()))
        assert os.stat(f"/dev/shm/{segment.name}").st_blocks * 512 >= 1 << 20  # allocated, not sparse
    finally:
        segment.close()
    created = []
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, o, n: created.append(fd) or _no_room(fd, o, n))
    with pytest.raises(OSError, match="No space"):
        Segment(1 << 20)
    assert created and not [p for p in os.listdir("/dev/shm") if p.startswith(segment_prefix(os.getpid()))]


def test_a_worker_whose_answer_dev_shm_cannot_hold_answers_through_ray(monkeypatch):
    segments = DriverSegments()
    try:
        name = segments.answer_segment(0)
        monkeypatch.setattr(os, "posix_fallocate", _no_room)
        value = segments.received(0, Unfit({"x": 1}, needed=1 << 20))
        assert value == {"x": 1}  # the answer itself is kept
        assert segments.answer_segment(0) is None and name is not None
        with pytest.raises(FileNotFoundError):
            Attached().buffer(name)  # the old segment is gone too
    finally:
        monkeypatch.undo()
        segments.close()
