"""The driver's round timer: the workers the round waited for, utilisation, GPU memory only where
measured, and the shares of the one-line summary. Times are set by hand, not measured."""

import types

import pytest

from raysim.engine import round_timer
from raysim.engine.round_timer import RoundTimer, time_shares, time_summary, waited_for, worker_metrics
from raysim.types import RoundOutput, WorkerTimes

FAST = WorkerTimes(busy_s=2.0, broadcast_s=0.1, data_loading_s=0.4, training_s=1.0, reduce_s=0.2)
SLOW = WorkerTimes(busy_s=5.0, broadcast_s=0.1, data_loading_s=1.0, training_s=3.5, reduce_s=0.3)


@pytest.fixture
def clock(monkeypatch):
    fake = types.SimpleNamespace(now=0.0)
    fake.perf_counter = lambda: fake.now
    monkeypatch.setattr(round_timer, "time", fake)
    return fake


def test_side_by_side_workers_count_by_the_slowest_and_turn_takers_add_up():
    assert waited_for([FAST, SLOW], is_concurrent=True) == pytest.approx(
        {"broadcast": 0.1, "data_loading": 1.0, "training": 3.5, "reduce": 0.3}
    )
    assert waited_for([FAST, SLOW], is_concurrent=False) == pytest.approx(
        {"broadcast": 0.2, "data_loading": 1.4, "training": 4.5, "reduce": 0.5}
    )


def test_a_round_splits_into_phases_and_other_that_add_up_to_its_wall_time(clock):
    """Sampling 1 s, broadcast 2, a 6 s wait for two side-by-side workers (the slow one's phases
    4.9 s, the driver's merge 0.5: 0.6 of the wait is other), server 3, 0.5 s unlapped (other):
    wall 12.5, other 1.1."""
    timer = RoundTimer(round_num=0)
    clock.now = 1.0
    timer.lap("sampling")
    clock.now = 3.0
    timer.lap("broadcast")
    clock.now = 9.0
    timer.add_cohort(RoundOutput(None, worker_times=[FAST, SLOW], merge_s=0.5), is_concurrent=True)
    clock.now = 12.0
    timer.lap("server_update")
    clock.now = 12.5
    metrics = timer.metrics()
    assert metrics["sys/time/wall_s"] == 12.5
    assert metrics["sys/time/training_s"] == 3.5 and metrics["sys/time/reduce_s"] == pytest.approx(0.8)
    assert metrics["sys/time/broadcast_s"] == pytest.approx(2.1)
    assert metrics["sys/time/evaluation_s"] == 0.0
    assert metrics["sys/time/other_s"] == pytest.approx(1.1)
    phases = sum(v for k, v in metrics.items() if k.startswith("sys/time/") and k != "sys/time/wall_s")
    assert phases == pytest.approx(12.5)
    assert metrics["sys/worker/0/utilization"] == pytest.approx(2 / 6)
    assert metrics["sys/worker/1/utilization"] == pytest.approx(5 / 6)


def test_utilisation_spread_and_gpu_memory_only_where_measured():
    on_cpu = worker_metrics([FAST, SLOW], window_s=10.0)
    assert on_cpu["sys/worker_utilization"] == pytest.approx(0.35)
    assert on_cpu["sys/worker_spread_s"] == pytest.approx(3.0)
    assert not [k for k in on_cpu if "gpu" in k]  # not a zero that looks measured
    on_gpu = worker_metrics([FAST, WorkerTimes(busy_s=1.0, gpu_max_allocated_bytes=2**30)], window_s=10.0)
    assert on_gpu["sys/worker/1/gpu_max_allocated_bytes"] == 2**30
    assert on_gpu["sys/gpu_max_allocated_bytes"] == 2**30
    assert "sys/worker/0/gpu_max_allocated_bytes" not in on_gpu


def test_the_summary_gives_each_phase_share_of_all_rounds_largest_first():
    """Rounds of 4 s and 6 s: training 3 + 3 = 60% of 10 s, evaluation 0 + 3 = 30%, other 10%."""
    history = [
        (-1, {"eval/central/accuracy": 0.1}),  # the initial evaluation is no round
        (0, {"sys/time/wall_s": 4.0, "sys/time/training_s": 3.0, "sys/time/other_s": 1.0}),
        (1, {"sys/time/wall_s": 6.0, "sys/time/training_s": 3.0, "sys/time/evaluation_s": 3.0}),
    ]
    shares = time_shares(history)
    assert list(shares)[:3] == ["training", "evaluation", "other"]
    assert shares["training"] == pytest.approx(0.6) and shares["other"] == pytest.approx(0.1)
    assert time_summary(history) == "time per round (mean 5.00 s): training 60%, evaluation 30%, other 10%"
    assert time_summary([(0, {"train/loss": 1.0})]) is None
