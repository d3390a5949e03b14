"""A ``ClusterTrainer`` runs the calls that use its resident model one at a time, whichever
thread they come on: its direct line's thread (``raysim.runtime.direct_line``) or Ray's."""

import threading
import time

from raysim.runtime.ray_workers import ClusterTrainer, one_at_a_time


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
