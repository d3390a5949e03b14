"""Where a round's time goes, end to end: each phase gets the time spent in it and no other phase
absorbs it, and the phases add up to the round's time; no GPU figure on a CPU. (The chart as an
artifact of an MLflow SQLite run: ``test_engine.py``'s MLflow test.)

A slow step is simulated by moving the timers' clock forward inside it (by seconds no real step
of this tiny job comes near), so the test needs no sleep and cannot race the machine's load.
"""

import time
import types

import pytest

from jobs import tiny_job
from raysim import registry
from raysim.aggregate import WeightedMean
from raysim.data.store import ClientStore
from raysim.engine import engine as engine_module
from raysim.engine import round_timer
from raysim.engine.engine import Engine
from raysim.engine.loop import run
from raysim.engine.round_timer import PHASES
from raysim.runtime import phase_timer

# Seconds each injected step takes on the timers' clock; per round: sampling, broadcast, server
# update and evaluation once, data loading, training and reduce once per client of the cohort.
STEP_S = {"sampling": 10_000, "broadcast": 20_000, "data_loading": 30_000, "training": 40_000,
          "reduce": 50_000, "server_update": 60_000, "evaluation": 70_000}  # fmt: skip
COHORT = 6
# More than any real phase of this job takes, on however loaded a machine (a loaded 2-core VM once
# took 7 s over the training phase's six clients), and far less than any injected step.
REAL_S = 600.0


@pytest.fixture
def slow_steps(monkeypatch):
    """Each phase's step made slow by ``STEP_S`` on the clock both timers read."""
    offset = [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0])
    monkeypatch.setattr(round_timer, "time", clock)
    monkeypatch.setattr(phase_timer, "time", clock)

    def slow(owner, name, phase, when=lambda *args: True):
        original = getattr(owner, name)

        def slowed(*args, **kwargs):
            if when(*args, **kwargs):
                offset[0] += STEP_S[phase]
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, slowed)

    fedavg = registry.get("algorithm", "fedavg").factory
    slow(Engine, "cohort", "sampling")
    slow(fedavg, "payload", "broadcast")
    slow(ClientStore, "client_data", "data_loading", lambda store, cid, split="train": split == "train")
    slow(fedavg, "client_update", "training")
    slow(WeightedMean, "add", "reduce")
    slow(fedavg, "server_update", "server_update")
    slow(engine_module, "evaluate_global", "evaluation")


def test_each_phase_gets_the_time_spent_in_it_and_no_other_absorbs_it(tmp_path, slow_steps, monkeypatch):
    """Timed from outside too, on the same clock, a round (run_round through end_round) takes at
    least its logged wall time, and not much more: what follows taking the metrics (logging)."""
    outside = outside_times(monkeypatch)
    job = tiny_job(
        engine={"num_rounds": 2, "cohort_size": COHORT},
        resources={"backend": "serial", "num_workers": 2},  # two workers taking turns: they add up
    )
    result = run(job, output_dir=tmp_path)
    per_client = {"data_loading", "training", "reduce"}
    for round_num, metrics in result.history:
        for phase in PHASES:
            expected = STEP_S[phase] * (COHORT if phase in per_client else 1)
            assert expected <= metrics[f"sys/time/{phase}_s"] < expected + REAL_S, (round_num, phase)
        assert 0 <= metrics["sys/time/other_s"] < REAL_S
        phases = sum(metrics[f"sys/time/{phase}_s"] for phase in (*PHASES, "other"))
        assert phases == pytest.approx(metrics["sys/time/wall_s"])
        assert metrics["sys/time/wall_s"] <= outside[round_num] < metrics["sys/time/wall_s"] + REAL_S
        assert not [key for key in metrics if "gpu" in key]  # on a CPU: absent, not a zero
    assert {"sys/worker/0/utilization", "sys/worker/1/utilization"} <= set(result.history[0][1])


def outside_times(monkeypatch) -> dict[int, float]:
    """Each round's time from the start of ``run_round`` to the end of ``end_round``, on the
    timers' clock."""
    outside: dict[int, float] = {}
    run_round, end_round = Engine.run_round, Engine.end_round

    def timed_run_round(self, state, round_num):
        outside[round_num] = round_timer.time.perf_counter()
        return run_round(self, state, round_num)

    def timed_end_round(self, state, round_num, metrics):
        logged = end_round(self, state, round_num, metrics)
        outside[round_num] = round_timer.time.perf_counter() - outside[round_num]
        return logged

    monkeypatch.setattr(Engine, "run_round", timed_run_round)
    monkeypatch.setattr(Engine, "end_round", timed_end_round)
    return outside
