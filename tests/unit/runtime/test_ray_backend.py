"""How ``RayBackend`` sends a round to each worker, without Ray: workers on the driver's node
through its segments, the others through the object store, whatever workers were lost."""

import numpy as np
import pytest

from raysim.aggregate import WeightedMean
from raysim.runtime import ray_backend
from raysim.runtime.direct_line import Lines, LineServer, OnLine
from raysim.runtime.ray_backend import RayBackend
from raysim.runtime.shared_segments import DriverSegments, Packed
from raysim.services import RoundOptions
from raysim.types import Payload, RoundOutput


class Method:
    def __init__(self, worker, name):
        self.worker, self.name = worker, name

    def remote(self, *args):
        self.worker.calls.append((self.name, args))
        return self.worker


class Worker:
    """A handle whose calls are recorded; its answer is an empty report."""

    def __init__(self):
        self.calls = []
        self.train, self.train_here = Method(self, "train"), Method(self, "train_here")


class Plugin:
    def aggregator(self):
        return WeightedMean()


@pytest.fixture
def pool(monkeypatch):
    """Three workers: bundles 0 and 1 on the driver's node, 2 on another."""
    backend = object.__new__(RayBackend)
    backend.workers = [Worker(), Worker(), Worker()]
    backend.bundle_of = {w: i for i, w in enumerate(backend.workers)}
    backend.local, backend.dead_workers = {0, 1}, 0
    backend.num_examples = np.full(10, 5)
    backend.segments = DriverSegments()
    backend.lines = Lines()  # none open: every call through Ray's path
    monkeypatch.setattr(ray_backend.ray, "put", lambda value: ("ref", value))
    empty = RoundOutput(aggregate=WeightedMean().zero())
    monkeypatch.setattr(RayBackend, "_await", lambda self, worker, ref: empty)
    yield backend
    backend.segments.close()


def round_calls(backend):
    payload = Payload({"w": np.ones(20_000, dtype=np.float32)})
    backend.train_cohort(Plugin(), payload, np.arange(6), 0, RoundOptions())
    calls = {i: w.calls[-1] for i, w in enumerate(backend.workers)}
    for worker in backend.workers:
        worker.calls.clear()
    return calls


def test_workers_on_the_drivers_node_read_the_segment_and_the_others_the_object_store(pool):
    calls = round_calls(pool)
    assert [calls[i][0] for i in range(3)] == ["train_here", "train_here", "train"]
    assert all(isinstance(calls[i][1][0].broadcast, Packed) for i in (0, 1))
    assert calls[2][1][0][0] == "ref"  # what ray.put returned
    assert calls[0][1][0].answer == pool.segments.answers[0].name  # an answer segment offered


def test_a_lost_local_worker_leaves_the_others_a_broadcast(pool):
    """A worker on the driver's node gone for good: the remote worker still gets the object
    store's copy (the pool's count of local workers no longer tells)."""
    pool._drop(pool.workers[0], "round 0")
    calls = round_calls(pool)
    assert sorted(calls) == [0, 1]  # the survivors, now bundles 1 and 2
    assert calls[0][0] == "train_here" and calls[1][0] == "train"
    assert calls[1][1][0] is not None and calls[1][1][0][0] == "ref"
    assert pool.local == {1}


class LineWorker(Worker):
    """A worker on the driver's node with a real direct line; ``open_line`` opens a new one."""

    def __init__(self, handler):
        super().__init__()
        self.handler, self.servers = handler, []
        self.open_line = Method(self, "open_line")

    def new_line(self):
        self.servers.append(LineServer(self.handler))
        return self.servers[-1].address


@pytest.fixture
def lined(pool, monkeypatch):
    """Bundle 0 with a line whose calls answer "on the line" (or stop its process on "stop");
    Ray's path (``_await``) answers "through Ray"; ``ray_result`` of ``open_line`` a new line."""

    def handler(call):
        if call == "stop":
            raise SystemExit(143)  # the line's connection ends: as a worker's death looks
        return "on the line"

    worker = LineWorker(handler)
    pool.workers[0] = worker
    pool.bundle_of = {w: i for i, w in enumerate(pool.workers)}
    assert pool.lines.open(0, worker.new_line())
    monkeypatch.setattr(RayBackend, "_await", lambda self, w, ref: "through Ray")
    monkeypatch.setattr(ray_backend, "ray_result", lambda ref: ref.new_line())
    yield pool, worker
    pool.lines.close()
    for server in worker.servers:
        server.close()


def test_a_rounds_answer_comes_on_the_line(lined):
    pool, worker = lined
    assert pool.lines.send(0, "train")
    assert pool._answer(worker, OnLine("train")) == "on the line"
    assert worker.calls == []  # nothing through Ray


def test_a_line_that_breaks_mid_call_sends_the_call_through_ray_then_opens_again(lined):
    pool, worker = lined
    assert pool.lines.send(0, "stop")
    assert pool._answer(worker, OnLine("stop")) == "through Ray"
    assert [name for name, _ in worker.calls] == ["train_here", "open_line"]
    assert worker.calls[0][1] == ("stop",)  # the same call, again
    assert 0 in pool.lines.open_lines and not pool.lines.broken and len(worker.servers) == 2


def test_a_line_that_broke_on_sending_opens_again_once_ray_answers(lined):
    pool, worker = lined
    pool.lines.close(0, broken=True)  # as a send that met a dead worker's socket leaves it
    assert not pool.lines.send(0, "train")
    assert pool._answer(worker, "a Ray ref") == "through Ray"
    assert [name for name, _ in worker.calls] == ["open_line"]
    assert 0 in pool.lines.open_lines and not pool.lines.broken
