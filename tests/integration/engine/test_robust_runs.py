"""Robust aggregation through whole runs on real digits: FedAvg breaks under 30% sign-flipping
clients while the coordinate-wise median holds, and a robust round gives the same model on one
worker, two workers and the vectorized path."""

import torch

from jobs import tiny_job
from raysim.engine.loop import run

ATTACK = {"kind": "sign_flip", "fraction": 0.3, "scale": 4.0}


def accuracy(result) -> float:
    return result.final["eval/clients/accuracy"]


def test_fedavg_breaks_under_sign_flipping_while_the_median_holds(tmp_path):
    engine = {"num_rounds": 8}
    fedavg = run(tiny_job(engine=engine, attack=ATTACK), output_dir=tmp_path / "fedavg")
    median = run(
        tiny_job(engine=engine, attack=ATTACK, robust={"rule": "median"}), output_dir=tmp_path / "median"
    )
    assert accuracy(median) > accuracy(fedavg) + 0.2, (accuracy(median), accuracy(fedavg))
    assert accuracy(fedavg) < 0.2  # ten classes: no better than chance
    malicious = [m["attack/malicious_in_cohort"] for _, m in median.history]
    assert len(malicious) == 8 and 0 < sum(malicious) < 8 * 6


def test_a_robust_round_is_the_same_on_one_two_and_vectorized_workers(tmp_path):
    robust = {"rule": "multi_krum", "f": 1}
    one = run(tiny_job(attack=ATTACK, robust=robust), output_dir=tmp_path / "one")
    two = run(
        tiny_job(attack=ATTACK, robust=robust, resources={"num_workers": 2}), output_dir=tmp_path / "two"
    )
    vectorized = run(
        tiny_job(attack=ATTACK, robust=robust, engine={"vectorize": "on"}), output_dir=tmp_path / "v"
    )
    assert one.final["robust/selected"] == 5.0
    for name, value in one.state.params.items():
        torch.testing.assert_close(two.state.params[name], value, rtol=0, atol=0)
        torch.testing.assert_close(vectorized.state.params[name], value, rtol=1e-5, atol=1e-6)
