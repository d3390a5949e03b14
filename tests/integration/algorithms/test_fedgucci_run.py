"""FedGuCci and FedGuCci+ run end to end (serial backend, 2 rounds of the tiny digits job).

With N = 2 anchors, round 0 has one anchor (the global model, sent as the params) and round 1
two: the older one travels in ``payload.extra.anchors``, which the engine counts apart as
``sys/bytes_down/anchors``: exactly one model per cohort client in round 1, nothing in round 0.
"""

import math

import pytest
import torch

from jobs import tiny_job
from raysim.checkpoint import load_checkpoint
from raysim.engine.loop import run


@pytest.mark.parametrize("name", ["fedgucci", "fedgucci_plus"])
def test_two_rounds_send_the_older_anchor_and_stay_finite(name, tmp_path):
    job = tiny_job(
        algorithm={"name": name, "num_anchors": 2, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        engine={"num_rounds": 2, "cohort_size": 3},
    )
    result = run(job, output_dir=tmp_path)
    history = dict(result.history)
    model_bytes = sum(v.numel() * v.element_size() for v in result.state.params.values())
    assert history[0]["sys/bytes_down/anchors"] == 0
    assert history[1]["sys/bytes_down/anchors"] == 3 * model_bytes  # the MLP has no buffers
    assert history[1]["sys/bytes_down"] == 2 * history[1]["sys/bytes_down/params"]
    anchors = result.state.extra.anchors
    assert len(anchors) == 2 and all(anchors[0][k].equal(v) for k, v in result.state.params.items())
    for round_num in (0, 1):
        metrics = history[round_num]
        assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["eval/clients/loss"])
        assert metrics["train/steps"] > 0
    assert all(v.isfinite().all() for v in result.state.params.values())


def test_uniform_alpha_runs_through_the_workers_job_round_trip(tmp_path):
    """The worker validates the job's full dump again (``alpha: null``): it must not be refused."""
    job = tiny_job(
        algorithm={"name": "fedgucci", "alpha_mode": "uniform", "local": {"epochs": 1, "batch_size": 16}},
        engine={"num_rounds": 1, "cohort_size": 2},
    )
    result = run(job, output_dir=tmp_path)
    assert math.isfinite(dict(result.history)[0]["train/loss"])


def test_a_branch_from_fedavg_takes_the_parents_models_as_anchors(tmp_path):
    local = {"epochs": 1, "batch_size": 16, "lr": 0.1}
    engine = {"num_rounds": 3, "cohort_size": 2, "checkpoint_every": 1}
    parent = run(
        tiny_job(algorithm={"name": "fedavg", "local": local}, engine=engine | {"num_rounds": 2}),
        output_dir=tmp_path / "fedavg",
    )
    checkpoints = parent.run_dir / "checkpoints"
    branch = run(
        tiny_job(algorithm={"name": "fedgucci", "num_anchors": 3, "local": local}, engine=engine),
        resume_from=str(checkpoints / "round_00001.pt"),
        output_dir=tmp_path / "fedgucci",
        branch=True,  # another job's checkpoint
    )
    model_bytes = sum(v.numel() * v.element_size() for v in parent.state.params.values())
    assert branch.history[0][0] == 2
    assert branch.history[0][1]["sys/bytes_down/anchors"] == 2 * 2 * model_bytes  # rounds 0 and 1
    newest, *older = branch.state.extra.anchors
    for anchor, round_num in zip(older, (1, 0), strict=True):
        parents = load_checkpoint(checkpoints / f"round_{round_num:05d}.pt")[0].params
        assert all(torch.equal(anchor[k], parents[k]) for k in parents)
