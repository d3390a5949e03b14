"""A ``ClusterTrainer`` runs the calls that use its resident model one at a time, whichever
thread they come on: its direct line's thread (``raysim.runtime.direct_line``) or Ray's."""

import threading
import time
from types import SimpleNamespace

import torch

from raysim.runtime.ray_workers import ClusterTrainer, on_main_thread_only, one_at_a_time


class Resident:
    """Counts the calls inside at once."""

    def __init__(self):
        self.busy = threading.RLock()
        self.inside = self.most = 0

    @one_at_a_time
    def use(self, seconds):
        self.inside += 1
        self.most = max(self.most, self.inside)
        time.sleep(seconds)
        self.inside -= 1
        return "used"

    @one_at_a_time
    def use_twice(self):  # as ``train_here`` calls ``train``
        return self.use(0)


def test_calls_from_several_threads_never_overlap():
    resident = Resident()
    threads = [threading.Thread(target=resident.use, args=(0.05,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert resident.most == 1


def test_a_locked_call_may_make_another_on_its_own_thread():
    done = []
    thread = threading.Thread(target=lambda: done.append(Resident().use_twice()))
    thread.start()
    thread.join(timeout=10)
    assert done == ["used"]  # no deadlock


def test_every_call_that_uses_the_model_is_locked():
    locked = {name for name in dir(ClusterTrainer) if hasattr(getattr(ClusterTrainer, name), "__wrapped__")}
    assert {"train", "train_here", "personalize", "evaluate_personal", "map_units"} <= locked
    assert not {"where", "maps", "open_line"} & locked  # no model: answered while a round runs


def test_a_worker_vectorizing_on_a_cpu_opens_no_direct_line():
    """Its chunks' tensors keep their pages only on the main thread, where Ray runs its rounds."""
    vectorizing = SimpleNamespace(vectorizes=True, device=torch.device("cpu"), line=None, train_here=None)
    assert ClusterTrainer.open_line(vectorizing) is None
    assert vectorizing.line is None  # no socket, no thread


def test_a_sequential_worker_opens_its_direct_line_once():
    cpu = torch.device("cpu")
    worker = SimpleNamespace(vectorizes=False, device=cpu, line=None, train_here=lambda call: call)
    address = ClusterTrainer.open_line(worker)
    try:
        assert address is not None and address == worker.line.address
        assert ClusterTrainer.open_line(worker) == address  # the same line at the next ask
    finally:
        worker.line.close()


def test_only_chunks_trained_on_a_cpu_keep_to_the_main_thread():
    assert on_main_thread_only(True, torch.device("cpu"))
    assert not on_main_thread_only(False, torch.device("cpu"))
    assert not on_main_thread_only(True, torch.device("cuda", 0))  # CUDA's own allocator caches
