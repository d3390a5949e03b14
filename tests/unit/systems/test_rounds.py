"""Client availability, device speed, stragglers and the simulated clock (raysim.systems).

Every expected value is worked out by hand in the test from the model of time in the module
docstring: a client reports ``2 * model_bytes / bytes_per_s + examples / examples_per_s`` after
the round starts, where ``examples`` counts the examples its local steps visit (whole passes of
``n`` examples, then full batches of ``B``)."""

import math

import numpy as np
import pytest
from fleets import SPEEDS, WORK, finish_time, fleet, system, write

from raysim.config.system import (
    SystemConfig,
    TraceAvailability,
)
from raysim.errors import ConfigError
from raysim.sampling import sample_cohort
from raysim.systems.availability import open_availability
from raysim.systems.rounds import (
    DROPPED_OUT,
    OFFLINE,
    REPORTED,
    STRAGGLER,
    client_outcome,
    drops_out,
    straggler_epochs,
    straggler_positions,
)


def test_a_client_reports_after_download_compute_and_upload():
    # comm 2 s (1e6 bytes down and up at 1e6 B/s), compute 100 examples at 50 ex/s = 2 s
    outcome = client_outcome(50, 8, WORK, 50.0, comm_s=2.0, limit_s=5.0, partial_work=False)
    assert (outcome.status, outcome.seconds, outcome.steps) == (REPORTED, 4.0, 8)


def test_a_late_client_is_dropped_at_its_limit_or_does_the_steps_that_fit():
    late = client_outcome(50, 8, WORK, 50.0, comm_s=2.0, limit_s=3.5, partial_work=False)
    assert (late.status, late.seconds, late.steps) == (STRAGGLER, 3.5, 0)
    # 1.5 s of compute = 75 examples: a pass (50) and one batch of 16 -> 5 steps, 66 examples
    partial = client_outcome(50, 8, WORK, 50.0, comm_s=2.0, limit_s=3.5, partial_work=True)
    assert (partial.status, partial.steps) == (REPORTED, 5)
    assert partial.seconds == pytest.approx(2.0 + 66 / 50)
    # 0.2 s = 10 examples: not one batch
    assert client_outcome(50, 8, WORK, 50.0, 2.0, 2.2, partial_work=True).status == STRAGGLER


def test_over_commitment_keeps_exactly_the_first_to_finish():
    plan = system(SystemConfig(over_commit=2.0), fleet(SPEEDS)).round(0)
    drawn = np.arange(10)[sample_cohort(10, 6, 0, 0)]  # ceil(2.0 * 3) of the 10 available
    assert plan.selected.tolist() == drawn.tolist()
    fastest = sorted(drawn.tolist(), key=finish_time)[:3]
    assert sorted(plan.cohort.tolist()) == sorted(fastest)
    assert plan.cohort.tolist() == [c for c in drawn if c in fastest]  # in draw order
    assert plan.end_s == pytest.approx(finish_time(fastest[-1]))  # the 3rd report
    metrics = plan.metrics()
    assert metrics["sys/dropped_stragglers"] == 3 and metrics["sys/selected_clients"] == 6
    assert metrics["sys/sim_round_s"] == pytest.approx(plan.end_s) and not plan.step_budgets


def test_over_commitment_rounds_up_without_float_noise_and_within_the_available():
    plan = system(SystemConfig(over_commit=1.3), fleet(SPEEDS * 2), cohort_size=10).round(0)
    assert len(plan.selected) == 13  # 1.3 * 10 is 13.000000000000002 in floating point
    plan = system(SystemConfig(over_commit=1.5), fleet(SPEEDS), cohort_size=10).round(0)
    assert len(plan.selected) == 10  # all there are


def test_a_deadline_drops_exactly_the_clients_not_done_by_it():
    # done by 4.5 s: speeds with 2 + 100/speed <= 4.5, i.e. speed >= 40
    sim = system(SystemConfig(deadline_s=4.5), fleet(SPEEDS), cohort_size=10)
    plan = sim.round(0)
    assert sorted(plan.cohort.tolist()) == [c for c in range(10) if SPEEDS[c] >= 40]
    assert plan.end_s == pytest.approx(4.5)  # fewer than 10 report: the round waits for the deadline
    assert plan.metrics()["sys/dropped_stragglers"] == 5
    # the next round starts where this one ended
    assert sim.round(1).start_s == pytest.approx(4.5) and sim.round(1).end_s == pytest.approx(9.0)


def test_partial_work_trains_the_steps_that_fit_before_the_deadline():
    plan = system(SystemConfig(deadline_s=4.5, partial_work=True), fleet(SPEEDS), cohort_size=10).round(0)
    # 2.5 s of compute: speed 10 -> 25 examples -> 1 step; 20 -> 50 -> 4 (one pass); 25 -> 62.5 -> 4;
    # 30 -> 75 -> 5; 5 -> 12.5 -> none: dropped
    assert plan.step_budgets == {0: 1, 1: 4, 2: 4, 9: 5}
    assert sorted(plan.cohort.tolist()) == [c for c in range(10) if c != 6]
    outcomes = dict(zip(plan.selected.tolist(), plan.outcomes, strict=True))
    assert outcomes[0].seconds == pytest.approx(2 + 16 / 10) and outcomes[6].status == STRAGGLER


def test_when_fewer_report_the_round_waits_for_every_drawn_client_or_its_failure():
    speeds = [10.0, 20.0, 50.0]
    plan = system(SystemConfig(), fleet(speeds), cohort_size=3).round(0)
    assert plan.end_s == pytest.approx(2 + 100 / 10)  # everyone reports: the slowest
    dropping = SystemConfig(dropout=0.5)
    drops = [drops_out(0.5, 0, 0, c) for c in range(3)]
    plan = system(dropping, fleet(speeds), cohort_size=3).round(0)
    assert [o.status == DROPPED_OUT for o in plan.outcomes] == [drops[c] for c in plan.selected]
    # dropped-out clients are noticed when their reports were due: the round lasts as long
    assert plan.end_s == pytest.approx(2 + 100 / 10)
    assert plan.metrics()["sys/dropped_out"] == sum(drops)


def test_dropout_is_seeded_per_round_and_client_with_rate_p():
    draws = [drops_out(0.3, 7, r, c) for r in range(200) for c in range(100)]
    assert abs(np.mean(draws) - 0.3) < 4 * math.sqrt(0.3 * 0.7 / len(draws))
    assert draws == [drops_out(0.3, 7, r, c) for r in range(200) for c in range(100)]
    assert not any(drops_out(0.0, 7, r, 0) for r in range(100))


def test_fedprox_stragglers_do_random_epochs_in_1_to_E():
    epochs = [straggler_epochs(4, 0, r, c) for r in range(50) for c in range(20)]
    assert set(epochs) == {1, 2, 3, 4}
    assert len(straggler_positions(10, 0.3, 0, 5)) == 3 and straggler_positions(10, 0.3, 0, 5) == (
        straggler_positions(10, 0.3, 0, 5)
    )


def test_fedprox_stragglers_keep_partial_work_or_are_dropped():
    speeds = [1000.0] * 10  # fast: only the straggling limits work
    config = SystemConfig(straggler_fraction=0.5, partial_work=True)
    plan = system(config, fleet(speeds), epochs=3, cohort_size=10).round(2)
    stragglers = {int(plan.selected[i]) for i in straggler_positions(10, 0.5, 0, 2)}
    epochs = {c: straggler_epochs(3, 0, 2, c) for c in stragglers}
    # 50 examples in batches of 16: 4 steps an epoch; full work 12 steps
    assert plan.step_budgets == {c: 4 * e for c, e in epochs.items() if e < 3}
    assert len(stragglers) == 5 and plan.step_budgets  # this seed draws some short ones
    assert len(plan.cohort) == 10
    dropped = system(config.model_copy(update={"partial_work": False}), fleet(speeds), epochs=3,
                     cohort_size=10).round(2)  # fmt: skip
    assert sorted(dropped.cohort.tolist()) == sorted(set(range(10)) - {c for c, e in epochs.items() if e < 3})
    assert not dropped.step_budgets


def test_a_round_waits_for_an_available_client_and_drops_who_goes_offline(tmp_path):
    # client 0 comes online at 10 s, for 3 s: not long enough for its 4 s of work
    path = write(tmp_path, {"clients": {"0": [[10, 13]], "1": [[10, 100]], "2": [[50, 60]]}})
    devices = fleet([50.0] * 3, availability=open_availability(TraceAvailability(path=path), 3, 0))
    plan = system(SystemConfig(), devices, cohort_size=2).round(0)
    assert plan.start_s == 10 and plan.idle_s == 10 and plan.available == 2
    statuses = dict(zip(plan.selected.tolist(), [o.status for o in plan.outcomes], strict=True))
    assert statuses == {0: OFFLINE, 1: REPORTED}
    assert plan.cohort.tolist() == [1] and plan.end_s == pytest.approx(14.0)
    assert plan.metrics()["sys/dropped_offline"] == 1
    assert plan.metrics()["sys/sim_round_s"] == pytest.approx(14.0)


def test_a_trace_that_ends_stops_the_run_with_the_fix(tmp_path):
    path = write(tmp_path, {"clients": {"0": [[0, 5]]}})
    devices = fleet([50.0], availability=open_availability(TraceAvailability(path=path), 1, 0))
    sim = system(SystemConfig(), devices, cohort_size=1)
    assert sim.round(0).end_s == 4.0  # it reports at 4 s
    assert sim.round(1).outcomes[0].status == OFFLINE and sim.round(1).end_s == 5.0  # gone at 5 s
    with pytest.raises(ConfigError, match="no training client is online at or after 5 s.*period_s"):
        sim.round(2)


def test_a_resumed_run_replays_the_clock_without_training():
    config = SystemConfig(over_commit=1.5, dropout=0.2, deadline_s=6.0)
    once = system(config, fleet(SPEEDS))
    ends = [once.round(r).end_s for r in range(5)]
    resumed = system(config, fleet(SPEEDS)).round(4)  # as a run resumed at round 4 asks
    assert resumed.end_s == ends[4] and resumed.start_s == ends[3]


class Slowest:
    """A selector picking the slowest candidates, whose picks cannot be a uniform draw."""

    def select(self, candidates, k, round_num, rng):
        return np.array(sorted(candidates, key=lambda c: SPEEDS[c])[:k])


def test_a_selector_draws_the_clocks_clients_and_a_resumed_clock_replays_nothing():
    sim = system(SystemConfig(over_commit=2.0), fleet(SPEEDS), cohort_size=2)
    sim.selector = Slowest()
    plan = sim.round(0)
    assert list(plan.selected) == [6, 0, 1, 2]  # 5, 10, 20, 25 examples/s
    assert list(plan.cohort) == [1, 2] and plan.durations() == {c: finish_time(c) for c in (6, 0, 1, 2)}
    sim.resume([100.0, 250.0])
    assert sim.round(2).start_s == 250.0 and sim.ends == [100.0, 250.0, sim.round(2).end_s]
