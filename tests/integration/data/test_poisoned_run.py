"""A digits job with augmentation and one poisoned client: it trains, logs clean and backdoor
accuracy, repeats itself bit for bit, and bad poisoning is refused before any training."""

import math

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.errors import ConfigError

DATASET = {
    "central_test_size": 200,
    "augment": {"crop_padding": 1},
    "poison": {"clients": [0], "fraction": 0.5, "target": 0, "trigger_size": 3},
}


def test_a_poisoned_run_logs_clean_and_backdoor_accuracy(tmp_path):
    job = tiny_job(dataset=DATASET, engine={"num_rounds": 2, "cohort_size": 20})
    first = run(job, output_dir=tmp_path / "a")
    for key in ("eval/central/accuracy", "eval/central/backdoor_accuracy"):
        assert math.isfinite(first.final[key]) and 0 <= first.final[key] <= 1
    again = run(job, output_dir=tmp_path / "b").state.params
    assert all(torch.equal(first.state.params[k], again[k]) for k in again)  # seeded, not drawn freshly
    clean = run(tiny_job(dataset={"central_test_size": 200}, engine={"num_rounds": 2, "cohort_size": 20}),
                output_dir=tmp_path / "c")  # fmt: skip
    assert "eval/central/backdoor_accuracy" not in clean.final
    assert not all(torch.equal(clean.state.params[k], again[k]) for k in again)  # the batches changed


@pytest.mark.parametrize(
    "poison, key",
    [
        ({"clients": [20]}, "dataset.poison.clients: client 20 is outside the population"),
        ({"clients": [0], "target": 10}, "dataset.poison.target: label 10 is out of range"),
    ],
)
def test_bad_poisoning_is_refused_before_training(tmp_path, poison, key):
    with pytest.raises(ConfigError, match=key):
        run(tiny_job(dataset={"poison": poison}), output_dir=tmp_path)
    assert not (tmp_path / "tiny").exists() or not any((tmp_path / "tiny").rglob("*.pt"))


def test_auto_trains_augmented_clients_one_by_one_and_on_refuses(tmp_path):
    def final(mode):
        algorithm = {"name": "fedprox", "mu": 0.1, "local": {"batch_size": 16, "lr": 0.05}}
        engine = {"vectorize": mode, "num_rounds": 1}
        job = tiny_job(algorithm=algorithm, dataset={"augment": {}}, engine=engine)
        return run(job, output_dir=tmp_path / mode).state.params

    off, auto = final("off"), final("auto")
    assert all(torch.equal(auto[k], off[k]) for k in off)
    with pytest.raises(ConfigError, match="dataset.augment: .*set engine.vectorize to auto or off"):
        final("on")
