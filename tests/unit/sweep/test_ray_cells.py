"""A sweep whose cells no node can hold is refused before any starts, naming them and the fix."""

import pytest

from raysim.errors import ResourceError
from raysim.sweep import ray_cells
from raysim.sweep.ray_cells import CellTask, refuse_unfit

NODES = [
    {"Alive": True, "Resources": {"CPU": 4.0}},
    {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
    {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # a dead node holds nothing
]


def task(name, cpus, gpus=0.0):
    return CellTask(name, lambda report: None, cpus, gpus)


def test_cells_that_fit_one_node_pass_and_the_others_are_named(monkeypatch):
    monkeypatch.setattr(ray_cells.ray, "nodes", lambda: NODES)
    refuse_unfit([task("a", 4.0), task("b", 2.0, 1.0), task("c", 1.0, 0.5)])
    with pytest.raises(ResourceError) as info:
        refuse_unfit([task("fits", 1.0), task("big", 5.0), task("gpu", 3.0, 1.0)])
    message = str(info.value)
    assert message.startswith("2 sweep cell(s) do not fit any node (big, gpu)")
    assert "the largest node has 4 CPU and 1 GPU" in message and "lower resources.cpus_per_worker" in message


def test_a_cancelled_cell_stops_even_where_its_keyboard_interrupt_is_lost():
    """Ray cancels a running cell by raising KeyboardInterrupt through its SIGINT handler, once;
    one lost in a class body of a lazy import (torch's, early in a cell) let the cell train on
    after a SIGTERM stopped its sweep (and end FINISHED). The cancel is also noted as a stop
    request, which the engine honours at the next client or round end."""
    import _thread
    import signal
    import time

    from raysim.stop_request import clear_stop_request, honour_stop_request
    from raysim.sweep.ray_cells import CANCELLED_EXIT_CODE, run_interruptibly

    def cell(reporter):
        try:
            _thread.interrupt_main()  # what ray.cancel does to the running task
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                sum(range(1000))
        except KeyboardInterrupt:
            pass  # lost where it landed
        honour_stop_request()  # the engine, at the next client or round end
        return "FINISHED"

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as stopped:
            run_interruptibly(cell, None)
    finally:
        clear_stop_request()
    assert stopped.value.code == CANCELLED_EXIT_CODE
    assert signal.getsignal(signal.SIGINT) is previous  # the worker's own handler is back for the next cell
