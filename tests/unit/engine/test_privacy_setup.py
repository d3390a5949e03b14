"""Every privacy setting that cannot be honoured is refused before training, one line each with
its fix (raysim/engine/privacy_setup.py); a budget the rounds exceed refuses the run or cuts it."""

import pytest

from raysim.config import JobConfig, deep_merge
from raysim.engine.privacy_setup import privacy_problems, rounds_allowed
from raysim.errors import ConfigError
from raysim.privacy.spending import spending_of
from raysim.runtime.builders import build_algorithm


def job(private: bool = True, **sections) -> JobConfig:
    base = {
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 20}},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg"},
        "engine": {"num_rounds": 10, "cohort_size": 5},
        "privacy": {"central": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-3},
    }
    if not private:
        del base["privacy"]
    return JobConfig.from_dict(deep_merge(base, sections))


def problems_of(config: JobConfig, population: int = 20) -> list[str]:
    return privacy_problems(config, build_algorithm(config), population)


def test_a_plain_private_fedavg_job_has_no_problem():
    assert problems_of(job()) == []
    assert problems_of(job(engine={"sampling": "poisson"})) == []


@pytest.mark.parametrize(
    "algorithm, says",
    [
        ("scaffold", "aggregates with Sum"),
        ("fedfomo", "aggregates with Gather"),
        ("oneshot_fedavg", "runs its own protocol"),
    ],
)
def test_a_server_that_does_not_sum_updates_is_named(algorithm, says):
    [problem] = problems_of(job(algorithm={"name": algorithm}))
    assert problem.startswith("privacy.central:") and says in problem and algorithm in problem


def test_delta_must_be_below_one_over_the_population():
    [problem] = problems_of(job(privacy={"delta": 0.05}), population=20)
    assert "not below 1 / population" in problem and "1/20" in problem


def test_poisson_sampling_and_local_dp_are_refused_for_a_plugin_with_its_own_protocol():
    staged = job(False, engine={"sampling": "poisson"}, algorithm={"name": "oneshot_fedavg"})
    [problem] = problems_of(staged)
    assert "needs a fixed cohort" in problem and "oneshot_fedavg" in problem
    local = {"local": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "central": None}
    [problem] = problems_of(job(algorithm={"name": "oneshot_fedavg"}, privacy=local))
    assert problem.startswith("privacy.local:") and "own protocol" in problem


def spending(config: JobConfig):
    assert config.privacy is not None
    return spending_of(
        config.privacy, config.engine.sampling, 20, config.engine.cohort_size, config.engine.num_rounds
    )


def test_a_budget_the_rounds_exceed_refuses_the_run_or_cuts_it():
    noisy = {"clip_bound": 1.0, "noise_multiplier": 4.0}  # epsilon 0.7 after 1 round, 2.9 after 10
    refuse = job(privacy={"central": noisy, "budget": {"epsilon": 1.0}})
    with pytest.raises(ConfigError, match=r"10 rounds spend epsilon .* rounds fit: set engine.num_rounds="):
        rounds_allowed(refuse, spending(refuse))
    stop = job(privacy={"central": noisy, "budget": {"epsilon": 2.0, "when_reached": "stop"}})
    allowed = rounds_allowed(stop, spending(stop))
    assert allowed is not None and 0 < allowed < 10
    assert spending(stop).epsilon(allowed) <= 2.0 < spending(stop).epsilon(allowed + 1)
    too_little = job(privacy={"central": noisy, "budget": {"epsilon": 0.5, "when_reached": "stop"}})
    with pytest.raises(ConfigError, match="one round already spends more than epsilon 0.5"):
        rounds_allowed(too_little, spending(too_little))
    roomy = job(privacy={"budget": {"epsilon": 1e6}})
    assert rounds_allowed(roomy, spending(roomy)) is None


def test_a_target_epsilon_is_met_by_the_calibrated_noise():
    target = job(privacy={"central": {"noise_multiplier": None, "target_epsilon": 2.0}})
    spent = spending(target)
    assert spent.epsilon(10) == pytest.approx(2.0, rel=1e-2) and spent.epsilon(10) <= 2.0
    # noise multiplier 4096 still spends 0.17 over 100,000 rounds: the search gives up there
    unreachable = job(
        privacy={"central": {"noise_multiplier": None, "target_epsilon": 0.01}},
        engine={"num_rounds": 100_000},
    )
    with pytest.raises(ValueError, match="0.01"):
        spending(unreachable)


def test_sample_level_delta_must_be_below_one_over_the_largest_clients_examples():
    sample = {"sample": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "central": None, "delta": 1e-3}
    config = job(privacy=sample)
    [problem] = privacy_problems(config, build_algorithm(config), 20, most_examples=5000)
    assert "not below 1 / examples of the largest client (1/5000)" in problem
    assert privacy_problems(config, build_algorithm(config), 20, most_examples=100) == []
