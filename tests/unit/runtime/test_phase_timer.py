"""A worker's phase timer: nested phases count once, in the innermost; no GPU figure on a CPU."""

import types

import pytest
import torch

from raysim.runtime import phase_timer
from raysim.runtime.phase_timer import PhaseTimer


@pytest.fixture
def clock(monkeypatch):
    """A stopped clock the test moves by hand: every figure is exact."""
    fake = types.SimpleNamespace(now=100.0)
    fake.perf_counter = lambda: fake.now
    monkeypatch.setattr(phase_timer, "time", fake)
    return fake


def test_a_nested_phase_pauses_the_enclosing_one(clock):
    """1 s outside any phase, training 2 + 4 around 3 s of data loading, then 5 s of reduce:
    training 6, data loading 3, reduce 5, busy 15 (the 1 s is busy but in no phase)."""
    timer = PhaseTimer(torch.device("cpu"))
    clock.now += 1
    with timer.phase("training"):
        clock.now += 2
        with timer.phase("data_loading"):
            clock.now += 3
        clock.now += 4
    with timer.phase("reduce"):
        clock.now += 5
    times = timer.times()
    assert (times.training_s, times.data_loading_s, times.reduce_s, times.broadcast_s) == (6, 3, 5, 0)
    assert times.busy_s == 15


def test_a_phase_that_raises_is_counted_and_closed(clock):
    timer = PhaseTimer()
    with pytest.raises(ValueError), timer.phase("training"):
        clock.now += 2
        raise ValueError("a client failed")
    with timer.phase("reduce"):  # training is no longer open: this is reduce alone
        clock.now += 1
    assert (timer.times().training_s, timer.times().reduce_s) == (2, 1)


def test_no_gpu_memory_is_reported_on_a_cpu():
    assert PhaseTimer(torch.device("cpu")).times().gpu_max_allocated_bytes is None


def test_on_a_gpu_the_round_peak_is_reported_from_a_reset_at_the_round_start(monkeypatch):
    """torch.cuda stood in for (no GPU here): the peak is reset when the round's timer starts, so
    the figure is this round's, not the worker's lifetime's."""
    calls = []

    def peak(device):
        calls.append(("peak", device))
        return 123

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", peak)
    gpu = torch.device("cuda", 1)
    timer = PhaseTimer(gpu)
    assert calls == [("reset", gpu)]
    assert timer.times().gpu_max_allocated_bytes == 123 and calls[-1] == ("peak", gpu)
