"""Client availability, device speed, stragglers and the simulated clock (raysim.systems).

Every expected value is worked out by hand in the test from the model of time in the module
docstring: a client reports ``2 * model_bytes / bytes_per_s + examples / examples_per_s`` after
the round starts, where ``examples`` counts the examples its local steps visit (whole passes of
``n`` examples, then full batches of ``B``).
"""

import json
import math

import numpy as np
import pytest
from torch import nn

from raysim.config import JobConfig, TimeToTargetConfig
from raysim.config.system import (
    DiurnalAvailability,
    LognormalDevices,
    SystemConfig,
    TraceAvailability,
    TraceDevices,
)
from raysim.engine.evaluation import TimeToTarget
from raysim.errors import ConfigError
from raysim.sampling import sample_cohort
from raysim.systems.availability import Diurnal, open_availability
from raysim.systems.devices import Fleet, device_speeds
from raysim.systems.rounds import (
    DROPPED_OUT,
    OFFLINE,
    REPORTED,
    STRAGGLER,
    SimulatedSystem,
    client_outcome,
    drops_out,
    straggler_epochs,
    straggler_positions,
)
from raysim.systems.work import LocalWork, local_training
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

# ---- local work -----------------------------------------------------------------------------


def test_local_work_counts_batches_and_the_examples_they_visit():
    work = LocalWork(epochs=2, batch_size=16)  # 50 examples: batches of 16, 16, 16 and 2
    assert work.batches_per_epoch(50) == 4 and work.steps(50) == 8 and work.steps(50, epochs=1) == 4
    assert work.examples(50, 8) == 100  # two whole passes
    assert work.examples(50, 6) == 50 + 2 * 16  # a pass, then two full batches
    assert LocalWork(epochs=5, batch_size=16, max_steps=7).steps(50) == 7


def test_steps_within_a_budget_of_examples():
    work = LocalWork(epochs=3, batch_size=16)
    assert work.steps_within(50, 82) == 6  # 50 + 16 + 16 = 82 examples fit exactly
    assert work.steps_within(50, 81.9) == 5
    assert work.steps_within(50, 99) == 7  # the pass's short last batch needs all 50: not 2 left
    assert work.steps_within(50, 100) == 8
    assert work.steps_within(50, 15) == 0 and work.steps_within(0, 100) == 0


def test_local_training_found_in_the_algorithm_config_or_a_nested_plugin():
    fedprox = JobConfig.from_dict(
        {"dataset": {"name": "digits"}, "model": {"name": "mlp"},
         "algorithm": {"name": "fedprox", "local": {"epochs": 4}}}
    )  # fmt: skip
    assert local_training(fedprox.algorithm.config).epochs == 4
    ima = JobConfig.from_dict(
        {"dataset": {"name": "digits"}, "model": {"name": "mlp"},
         "algorithm": {"name": "ima", "average_from": 2, "inner": {"name": "fedavg", "local": {"epochs": 3}}}}
    )  # fmt: skip
    assert local_training(ima.algorithm.config).epochs == 3


def test_a_step_budget_caps_train_local_whatever_its_config():
    spec = DataSpec("classification", (3,), 2)
    rng = np.random.default_rng(0)
    data = ClientData({"x": rng.normal(size=(40, 3)).astype(np.float32), "y": np.arange(40) % 2})

    def steps(config, budget):
        metrics = train_local(nn.Linear(3, 2), data, config, seed=1, spec=spec, step_budget=budget)
        return metrics["train/steps"]

    config = LocalTrainConfig(epochs=2, batch_size=8)  # 5 batches a pass, 10 in all
    assert steps(config, None) == 10 and steps(config, 3) == 3 and steps(config, 50) == 10
    assert steps(config.model_copy(update={"max_steps": 2}), 3) == 2


# ---- one client ---------------------------------------------------------------------------------

WORK = LocalWork(epochs=2, batch_size=16)  # 50 examples: 8 steps visiting 100 examples


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


# ---- rounds -------------------------------------------------------------------------------------


def fleet(speeds, bandwidths=None, sizes=None, availability=None):
    n = len(speeds)
    kwargs = {} if availability is None else {"availability": availability}
    return Fleet(
        np.full(n, 50) if sizes is None else np.asarray(sizes),
        np.asarray(speeds, dtype=float),
        np.full(n, 1e6) if bandwidths is None else np.asarray(bandwidths, dtype=float),
        **kwargs,
    )


def system(config, devices, *, epochs=2, cohort_size=3, seed=0):
    pool = np.arange(len(devices.examples_per_s))
    local = LocalTrainConfig(epochs=epochs, batch_size=16)
    return SimulatedSystem(config, devices, local, pool, cohort_size=cohort_size, model_bytes=1e6, seed=seed)


SPEEDS = [10.0, 20.0, 25.0, 40.0, 50.0, 100.0, 5.0, 80.0, 60.0, 30.0]  # examples/s, client by client


def finish_time(client):
    return 2.0 + 100 / SPEEDS[client]  # comm 2 s; 2 epochs of 50 examples


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


def test_devices_draw_lognormal_speeds_per_client_from_the_seed():
    speed, bandwidth = device_speeds(LognormalDevices(examples_per_s_sigma=0.0), 5, seed=0)
    assert np.all(speed == 100.0) and not np.all(bandwidth == 1.25e6)
    a, _ = device_speeds(LognormalDevices(), 4000, seed=1)
    assert np.array_equal(a, device_speeds(LognormalDevices(), 4000, seed=1)[0])
    assert np.median(a) == pytest.approx(100.0, rel=0.05) and np.std(np.log(a)) == pytest.approx(
        0.5, rel=0.05
    )


# ---- availability -------------------------------------------------------------------------------


def write(tmp_path, raw, name="trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)


def test_availability_from_a_small_trace(tmp_path):
    path = write(tmp_path, {"clients": {"0": [[0, 10], [20, 30]], "1": [[5, 25]], "2": [[40, 50]]}})
    trace = open_availability(TraceAvailability(path=path), 3, seed=0)
    clients = np.arange(3)
    assert trace.online(clients, 0).tolist() == [True, False, False]
    assert trace.online(clients, 7).tolist() == [True, True, False]
    assert trace.online(clients, 10).tolist() == [False, True, False]  # intervals end open
    assert trace.online_until(0, 22) == 30 and trace.online_until(1, 5) == 25
    assert trace.next_online(clients, 31) == 40 and trace.next_online(np.array([0, 1]), 31) is None


def test_a_periodic_trace_repeats_and_joins_across_the_turn(tmp_path):
    path = write(tmp_path, {"period_s": 100, "clients": {"0": [[0, 10], [90, 100]], "1": [[50, 60]]}})
    trace = open_availability(TraceAvailability(path=path), 2, seed=0)
    assert trace.online(np.arange(2), 255).tolist() == [False, True]
    assert trace.online_until(0, 195) == 210  # online from 190 through the turn to 210
    assert trace.next_online(np.array([0]), 215) == 290
    always = write(tmp_path, {"period_s": 100, "clients": {"0": [[0, 100]]}}, "always.json")
    assert open_availability(TraceAvailability(path=always), 1, seed=0).online_until(0, 250) == math.inf


def test_clients_missing_from_a_trace(tmp_path):
    path = write(tmp_path, {"clients": {"0": [[0, 10]], "1": [[20, 30]]}})
    with pytest.raises(ConfigError, match="no entry for 2 of the 4 clients.*missing: cycle or always"):
        open_availability(TraceAvailability(path=path), 4, seed=0)
    always = open_availability(TraceAvailability(path=path, missing="always"), 4, seed=0)
    assert always.online(np.arange(4), 15).tolist() == [False, False, True, True]
    cycled = open_availability(TraceAvailability(path=path, missing="cycle"), 4, seed=0)
    assert cycled.online(np.arange(4), 25).tolist() == [False, True, False, True]  # 3 -> 1


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"clients": {"0": [[10, 5]]}}, "0 <= start < end"),
        ({"clients": {"0": [[0, 10], [5, 20]]}}, "sorted and disjoint"),
        ({"period_s": 50, "clients": {"0": [[0, 60]]}}, "ends after period_s"),
        ({"clients": {"a": [[0, 1]]}}, "client keys must be client ids"),
        ({"clients": {"0": "always"}}, "list of \\[start_s, end_s\\] pairs"),
        ([1, 2], 'a "clients" object'),
    ],
)
def test_bad_traces_are_refused_with_the_key_and_the_fix(tmp_path, raw, message):
    with pytest.raises(ConfigError, match=f"system.availability.path: .*{message}"):
        open_availability(TraceAvailability(path=write(tmp_path, raw)), 1, seed=0)


def test_device_traces(tmp_path):
    path = write(tmp_path, {"clients": {"0": {"examples_per_s": 5, "bytes_per_s": 100},
                                        "2": {"examples_per_s": 7, "bytes_per_s": 300}}})  # fmt: skip
    speed, bandwidth = device_speeds(TraceDevices(path=path, missing="cycle"), 4, seed=0)
    assert speed.tolist() == [5, 7, 7, 7] and bandwidth.tolist() == [100, 300, 300, 300]  # 1 -> 2, 3 -> 2
    with pytest.raises(ConfigError, match="system.devices.path: .*no entry for 2 of the 4"):
        device_speeds(TraceDevices(path=path), 4, seed=0)
    with pytest.raises(ConfigError, match="system.devices.path: cannot read"):
        device_speeds(TraceDevices(path=str(tmp_path / "absent.json")), 4, seed=0)


def test_diurnal_availability_follows_each_clients_phase():
    diurnal = Diurnal(DiurnalAvailability(period_s=100, online_fraction=0.25), 50, seed=3)
    phase = diurnal.phase
    clients = np.arange(50)
    for t in [0.0, 37.0, 120.5]:
        expected = ((t - phase) % 100) < 25
        assert diurnal.online(clients, t).tolist() == expected.tolist()
    c = int(np.flatnonzero(diurnal.online(clients, 10.0))[0])
    assert diurnal.online_until(c, 10.0) == pytest.approx(10.0 + 25 - (10.0 - phase[c]) % 100)
    off = int(np.flatnonzero(~diurnal.online(clients, 10.0))[0])
    assert diurnal.next_online(np.array([off]), 10.0) == pytest.approx(10.0 + 100 - (10.0 - phase[off]) % 100)


def test_the_moment_a_client_comes_online_it_is_online():
    """``next_online`` computes a window's start as t + (period - into); rounding may put it just
    before the window (one period away), and a round starting then would find nobody online."""
    rng = np.random.default_rng(0)
    misses = 0
    for trial in range(2000):
        config = DiurnalAvailability(period_s=float(rng.uniform(1, 1e5)), online_fraction=0.05)
        diurnal = Diurnal(config, 20, seed=trial)
        clients = np.arange(20)
        t = float(rng.uniform(0, 1e7))
        start = diurnal.next_online(clients, t)
        misses += not diurnal.online(clients, start).any()
    assert misses == 0


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


# ---- time to target -----------------------------------------------------------------------------


def test_time_to_target_logs_each_value_once():
    tta = TimeToTarget(TimeToTargetConfig(metric="eval/clients/accuracy", values=[0.5, 0.8]))
    key = "tta/eval/clients/accuracy_{}/{}"
    assert tta.reached({"eval/clients/accuracy": 0.4}, 0, 10.0) == {}
    assert tta.reached({"eval/clients/accuracy": 0.6}, 1, 20.0) == {
        key.format(0.5, "round"): 1.0, key.format(0.5, "sim_s"): 20.0
    }  # fmt: skip
    assert tta.reached({"eval/clients/accuracy": 0.55}, 2, 30.0) == {}
    assert tta.reached({"eval/clients/accuracy": 0.9}, 3, None) == {key.format(0.8, "round"): 3.0}
    loss = TimeToTarget(TimeToTargetConfig(metric="eval/clients/loss", values=[1.0], at_most=True))
    assert loss.reached({"eval/clients/loss": 0.9}, 4, None) == {"tta/eval/clients/loss_1/round": 4.0}
    with pytest.raises(ConfigError, match="'eval/clients/loss' is not evaluated.*evaluated: eval/x"):
        TimeToTarget(TimeToTargetConfig(metric="eval/clients/loss", values=[1.0])).reached(
            {"eval/x": 1}, 0, None
        )


def test_the_system_section_is_validated_and_absent_by_default():
    base = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    job = JobConfig.from_dict(base)
    assert job.system is None and "system" not in job.to_dict()
    assert "time_to_target" not in job.to_dict()["evaluation"]
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(base | {"system": {"over_commit": 0.5, "dropout": 1, "deadline": 3}})
    problems = "\n".join(info.value.problems)
    assert "system.over_commit" in problems and "system.dropout" in problems
    assert "system.deadline: unknown key; did you mean 'deadline_s'" in problems
    with pytest.raises(ConfigError, match="evaluation.time_to_target.metric: must be an evaluation metric"):
        JobConfig.from_dict(
            base | {"evaluation": {"time_to_target": {"metric": "train/loss", "values": [1]}}}
        )
    on = JobConfig.from_dict(base | {"system": {"availability": {"kind": "diurnal"}, "deadline_s": 60}})
    assert JobConfig.from_dict(on.to_dict()) == on
