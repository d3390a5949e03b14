"""The worker's privacy: with ``privacy.local`` each client's update leaves clipped and noised, the
noise a pure function of (seed, round, client) whichever trainer ran it; with ``privacy.sample``
its clients train with DP-SGD. Two-round digits jobs on the serial backend, end to end."""

import json
import math

import pytest
import torch

from raysim.checkpoint import read_checkpoint
from raysim.config import JobConfig
from raysim.engine.loop import run
from raysim.types import Params

LOCAL = {"local": {"clip_bound": 0.5, "noise_multiplier": 0.2}, "delta": 1e-5}
SAMPLE = {"sample": {"clip_bound": 1.0, "noise_multiplier": 0.8}, "delta": 1e-5}


def job(privacy: dict | None, seed: int = 3, vectorize: str = "off", algorithm: str = "fedavg") -> JobConfig:
    raw = {
        "name": "private",
        "seed": seed,
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": algorithm, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        "engine": {"num_rounds": 2, "cohort_size": 2, "vectorize": vectorize},
        "evaluation": {"every": 2},
        "resources": {"backend": "serial", "num_workers": 1},
        "tracking": {"enabled": False, "progress": False},
    }
    return JobConfig.from_dict(raw | ({"privacy": privacy} if privacy is not None else {}))


def final(tmp_path, name: str, job: JobConfig) -> Params:
    params = run(job, output_dir=tmp_path / name).state.params
    assert all(torch.isfinite(v).all() for v in params.values())
    return params


def equal(a: Params, b: Params) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_local_dp_noise_follows_the_seed_and_not_the_trainer(tmp_path):
    noised = final(tmp_path, "a", job(LOCAL))
    assert equal(noised, final(tmp_path, "b", job(LOCAL)))  # the same seed: the same model
    assert not equal(noised, final(tmp_path, "c", job(LOCAL, seed=4)))
    assert not equal(noised, final(tmp_path, "d", job(None)))  # the noise reached the model
    # the vectorized trainer adds the same noise to the same client: only training's rounding differs
    vectorized = final(tmp_path, "e", job(LOCAL, vectorize="on"))
    assert all(torch.allclose(vectorized[k], noised[k], atol=1e-5) for k in noised)


def test_dp_sgd_trains_each_client_and_is_reproducible(tmp_path):
    private = final(tmp_path, "a", job(SAMPLE, vectorize="auto"))  # auto: one client at a time
    assert equal(private, final(tmp_path, "b", job(SAMPLE)))
    assert not equal(private, final(tmp_path, "c", job(None)))


def test_dp_sgd_clients_report_their_counts_and_a_recalled_model_spends_nothing(tmp_path):
    """The local plugin's last round recalls the kept models of clients outside its cohort: they
    train nothing, report 0 noised steps, and the run's epsilon is its trained clients'."""
    history = run(job(SAMPLE), output_dir=tmp_path / "fedavg").history
    for _, metrics in history:  # the cohort's means of what each client reported
        assert metrics["privacy/sample/batch_size"] == 16 and metrics["privacy/sample/steps"] > 0
        assert metrics["privacy/sample/examples"] == metrics["train/num_examples"]  # one whole epoch
    assert 0 < history[0][1]["privacy/sample/epsilon"] < history[1][1]["privacy/sample/epsilon"]
    local = run(job(SAMPLE, algorithm="local"), output_dir=tmp_path / "local")
    cohorts = json.loads((local.run_dir / "cohorts.json").read_text())["cohorts"]
    trained = {c for cohort in cohorts for c in cohort}
    assert local.final["eval/local/clients/num_clients"] == len(trained) > len(cohorts[-1])  # some recalled
    counts = read_checkpoint(local.run_dir / "checkpoints" / "final.pt").privacy["clients"]
    assert sorted(counts["sampled"]) == sorted(trained) and counts["worst_sample"] > 0
    for client, [(examples, batch_size, steps)] in counts["sampled"].items():  # training steps alone
        assert steps == math.ceil(examples / batch_size) * sum(client in cohort for cohort in cohorts)


@pytest.mark.parametrize("privacy", [LOCAL, SAMPLE])
def test_a_private_run_sends_updates_of_the_plain_runs_size(tmp_path, privacy):
    plain = run(job(None), output_dir=tmp_path / "plain").history[-1][1]
    private = run(job(privacy), output_dir=tmp_path / "private").history[-1][1]
    assert private["sys/bytes_up"] == plain["sys/bytes_up"] > 0
