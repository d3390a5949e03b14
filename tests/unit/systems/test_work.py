"""The batches of a client's local work, as the simulated clock counts them (raysim.systems.work)."""

from raysim.config import JobConfig
from raysim.systems.work import LocalWork, local_training


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
