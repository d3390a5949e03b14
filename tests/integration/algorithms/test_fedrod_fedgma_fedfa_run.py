"""FedRoD, FedGMA (both variants) and FedFA run end to end: two rounds of the tiny digits job on
the serial backend, with every logged metric finite and each plugin's own state in shape.

FedFA starts its anchor loss and its calibration in round 1 (the IMA authors' schedule, shifted),
so both rounds' branches run: round 0 builds the anchors from the seed, round 1 pulls towards the
aggregated ones.
"""

import math

import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.engine.loop import run
from raysim.stored import plain

CASES = {
    "fedrod": ({"name": "fedrod"}, "fedrod/personal_train_accuracy"),
    "fedgma": ({"name": "fedgma"}, "fedgma/agreed_fraction"),
    "fedgma_ima_code": ({"name": "fedgma", "reading": "ima_code"}, "fedgma/agreed_fraction"),
    "fedfa": (
        {"name": "fedfa", "calibrate_from": 1, "anchor_loss_from": 1},
        "train/loss",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_rounds_give_finite_metrics(case, tmp_path):
    algorithm, own_metric = CASES[case]
    job = tiny_job(
        algorithm={**algorithm, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        engine={"num_rounds": 2, "cohort_size": 4},
    )
    result = run(job, output_dir=tmp_path)
    assert [round_num for round_num, _ in result.history] == [0, 1]
    for _, metrics in result.history:
        assert own_metric in metrics and "eval/clients/accuracy" in metrics
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert P.is_finite(result.state.params)
    P.check_loadable(plain(result.state.extra), "server state extra")  # what a checkpoint holds


def test_fedfa_keeps_one_anchor_per_class_of_the_feature_width(tmp_path):
    job = tiny_job(algorithm={"name": "fedfa"}, engine={"num_rounds": 2, "cohort_size": 4})
    anchors = run(job, output_dir=tmp_path).state.extra.anchors
    assert isinstance(anchors, torch.Tensor) and anchors.shape == (10, 16)  # digits, MLP hidden [16]
    assert torch.isfinite(anchors).all() and anchors.abs().sum() > 0
