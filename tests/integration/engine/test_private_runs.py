"""Central DP through whole runs on real digits: the epsilon logged each round is dp-accounting's for
the run's sampling and noise, a resumed run's accountant goes on where it stopped (and its model
equals the uninterrupted run's), the vectorized path and two workers release the same aggregate,
and a budget stops a run at the last round within it."""

import json
import math

import dp_accounting
import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run

DELTA = 1e-3  # below 1 / 20 clients


def private(**sections):
    privacy = {"central": {"clip_bound": 0.5, "noise_multiplier": 0.8}, "delta": DELTA}
    engine = {"sampling": "poisson", "num_rounds": 3}
    return tiny_job(
        privacy=privacy | sections.pop("privacy", {}), engine=engine | sections.pop("engine", {}), **sections
    )


def rdp_epsilon(rate: float, z: float, rounds: int) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(z))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return accountant.get_epsilon(DELTA)


def test_each_round_logs_the_epsilon_dp_accounting_computes(tmp_path):
    result = run(private(), output_dir=tmp_path)
    logged = {step: m["privacy/epsilon"] for step, m in result.history if "privacy/epsilon" in m}
    assert sorted(logged) == [0, 1, 2]
    for step, eps in logged.items():  # 6 expected clients of 20 each round, Poisson-sampled
        assert eps == pytest.approx(rdp_epsilon(6 / 20, 0.8, step + 1), rel=1e-9)
    assert result.final["privacy/noise_multiplier"] == 0.8 and result.final["privacy/clip_bound"] == 0.5
    assert all(torch.isfinite(v).all() for v in result.state.params.values())


def test_a_resumed_run_goes_on_with_its_accountant_and_its_model(tmp_path):
    whole = run(private(engine={"num_rounds": 4}), output_dir=tmp_path / "whole")
    first = run(private(engine={"num_rounds": 2}), output_dir=tmp_path / "first")
    checkpoint = first.run_dir / "checkpoints" / "final.pt"
    resumed = run(private(engine={"num_rounds": 4}), resume_from=str(checkpoint), output_dir=tmp_path / "r")
    assert [step for step, _ in resumed.history] == [2, 3]
    assert resumed.final["privacy/epsilon"] == pytest.approx(rdp_epsilon(6 / 20, 0.8, 4), rel=1e-9)
    for name, value in whole.state.params.items():
        assert torch.equal(value, resumed.state.params[name]), name


def test_two_workers_and_the_vectorized_path_release_the_same_aggregate(tmp_path):
    one = run(private(), output_dir=tmp_path / "one")
    two = run(private(resources={"num_workers": 2}), output_dir=tmp_path / "two")
    vectorized = run(private(engine={"vectorize": "on"}), output_dir=tmp_path / "vec")
    for name, value in one.state.params.items():
        torch.testing.assert_close(two.state.params[name], value, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(vectorized.state.params[name], value, rtol=1e-4, atol=1e-5)


def test_a_budget_stops_the_run_after_the_last_round_within_it(tmp_path):
    budget = (rdp_epsilon(6 / 20, 0.8, 2) + rdp_epsilon(6 / 20, 0.8, 3)) / 2  # 2 rounds fit, not 3
    job = private(
        privacy={"budget": {"epsilon": budget, "when_reached": "stop"}},
        engine={"num_rounds": 5},
        evaluation={"every": 10},  # so only the last round, 1 of 0..4, is evaluated
    )
    result = run(job, output_dir=tmp_path)
    assert [step for step, _ in result.history] == [0, 1]
    assert result.final["privacy/epsilon"] <= budget
    assert (
        "eval/clients/accuracy" in result.history[-1][1]
        and "eval/clients/accuracy" not in result.history[0][1]
    )


def test_adaptive_clipping_moves_the_bound_and_fedfish_releases_its_sums(tmp_path):
    adaptive = {"central": {"clip_bound": 0.5, "noise_multiplier": 0.8, "adaptive": {"count_stddev": 1.0}}}
    result = run(private(privacy=adaptive), output_dir=tmp_path / "a")
    bounds = [m["privacy/clip_bound"] for _, m in result.history]
    assert bounds[0] == 0.5 and len(set(bounds)) == 3
    fish = run(
        private(algorithm={"name": "fedfish", "local": {"epochs": 1, "batch_size": 16}}),
        output_dir=tmp_path / "f",
    )
    assert all(torch.isfinite(v).all() for v in fish.state.params.values())


def test_local_dp_counts_each_clients_reports_across_a_resume(tmp_path):
    local = {"local": {"clip_bound": 1.0, "noise_multiplier": 2.0}, "central": None}
    whole = run(private(privacy=local, engine={"num_rounds": 4}), output_dir=tmp_path / "whole")
    first = run(private(privacy=local, engine={"num_rounds": 2}), output_dir=tmp_path / "first")
    checkpoint = first.run_dir / "checkpoints" / "final.pt"
    resumed = run(
        private(privacy=local, engine={"num_rounds": 4}),
        resume_from=str(checkpoint),
        output_dir=tmp_path / "r",
    )
    most = max(sum(client in cohort for cohort in whole_cohorts(whole)) for client in range(20))
    assert resumed.final["privacy/local/max_reports"] == whole.final["privacy/local/max_reports"] == most
    # two clipped updates differ by up to 2C: each report is a Gaussian of multiplier 2.0 / 2
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), most))
    assert resumed.final["privacy/local/epsilon"] == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-9)


def whole_cohorts(result):
    return json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"]


def test_dp_ftrl_samples_one_group_a_round_and_is_accounted_as_its_participations(tmp_path):
    banded = {"central": {"clip_bound": 0.5, "noise_multiplier": 0.8, "bands": 2}}
    result = run(private(privacy=banded, engine={"num_rounds": 4}), output_dir=tmp_path)
    cohorts = whole_cohorts(result)
    assert all(not set(a) & set(b) for a, b in zip(cohorts, cohorts[1:]))  # at most once in 2 rounds
    for step, metrics in result.history:  # 6 expected of the round's 10-client group: rate 0.6
        accountant = dp_accounting.rdp.RdpAccountant()
        event = dp_accounting.PoissonSampledDpEvent(0.6, dp_accounting.GaussianDpEvent(0.8))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, math.ceil((step + 1) / 2)))
        assert metrics["privacy/epsilon"] == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-9)


def test_without_noise_and_with_a_bound_nothing_reaches_central_dp_is_unweighted_fedavg(tmp_path):
    """z = 0 and a bound no update reaches: the released mean is sum(delta_i) / cohort_size, the
    non-private FedAvg with uniform weights (an independent path: WeightedMean(weighted=False))."""
    free = {"central": {"clip_bound": 1e6, "noise_multiplier": 0.0}}
    dp = run(private(privacy=free, engine={"sampling": "fixed"}), output_dir=tmp_path / "dp")
    plain = tiny_job(
        algorithm={"name": "fedavg", "weighted": False, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}}
    )
    reference = run(plain, output_dir=tmp_path / "plain")
    for name, value in reference.state.params.items():
        torch.testing.assert_close(dp.state.params[name], value, rtol=1e-5, atol=1e-6)
    bounded = run(
        private(privacy={"central": {"clip_bound": 1e-3, "noise_multiplier": 0.0}}), output_dir=tmp_path / "b"
    )
    moved = max((bounded.state.params[k] - v).abs().max().item() for k, v in reference.state.params.items())
    assert moved > 1e-3  # a bound every update exceeds changes the model: the clip is applied
