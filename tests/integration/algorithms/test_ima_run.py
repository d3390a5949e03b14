"""IMA end to end: IMA(FedAvg) is FedAvg before its start round; branching from a FedAvg
checkpoint equals an IMA run from round 0 (the IMA paper's Sec. 7.2.3, Table II); an IMA
run resumed from its own checkpoint equals the uninterrupted run. All bit for bit (same seed)."""

import math
import shutil

import pytest
import torch

from jobs import tiny_job
from raysim.checkpoint import load_checkpoint
from raysim.config import JobConfig
from raysim.engine.loop import run
from raysim.errors import CheckpointError

FEDAVG = {"name": "fedavg", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1, "lr_decay": 0.9}}
IMA = {"name": "ima", "inner": FEDAVG, "average_from": 3, "window": 2}


def job(algorithm, num_rounds):
    raw = tiny_job(engine={"num_rounds": num_rounds, "checkpoint_every": 1}).to_dict()
    return JobConfig.from_dict({**raw, "algorithm": algorithm})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """FedAvg for the 3 rounds before IMA starts, and IMA(FedAvg) for 5 rounds from round 0."""
    out = tmp_path_factory.mktemp("ima")
    return run(job(FEDAVG, 3), output_dir=out / "fedavg"), run(job(IMA, 5), output_dir=out / "ima")


def saved_params(result, round_num):
    return load_checkpoint(result.run_dir / "checkpoints" / f"round_{round_num:05d}.pt")[0].params


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_before_it_averages_ima_is_fedavg(runs):
    fedavg, ima = runs
    for r in range(3):
        assert_same(saved_params(ima, r), saved_params(fedavg, r))
        assert ima.history[r][1]["eval/clients/accuracy"] == fedavg.history[r][1]["eval/clients/accuracy"]
        assert ima.history[r][1]["ima/active"] == 0.0
    assert [m["ima/active"] for _, m in ima.history[3:]] == [1.0, 1.0]
    assert all(m["ima/shift_norm"] > 0 for _, m in ima.history[3:])


def test_a_branch_from_the_fedavg_checkpoint_equals_the_run_from_round_0(runs, tmp_path):
    fedavg, ima = runs
    parent = fedavg.run_dir / "checkpoints" / "round_00002.pt"
    branch = run(job(IMA, 5), resume_from=str(parent), output_dir=tmp_path, branch=True)
    assert [step for step, _ in branch.history] == [3, 4]
    assert_same(branch.state.params, ima.state.params)
    for own, straight in zip(branch.state.extra.window, ima.state.extra.window, strict=True):
        assert_same(own, straight)


def test_an_ima_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(runs, tmp_path):
    _, ima = runs
    resumed = run(
        job(IMA, 5), resume_from=str(ima.run_dir / "checkpoints" / "round_00003.pt"), output_dir=tmp_path
    )
    assert [step for step, _ in resumed.history] == [4]
    assert_same(resumed.state.params, ima.state.params)


def test_a_branch_without_the_parents_earlier_checkpoints_is_refused(runs, tmp_path):
    fedavg, _ = runs
    alone = tmp_path / "copied" / "final.pt"
    alone.parent.mkdir()
    shutil.copy(fedavg.run_dir / "checkpoints" / "final.pt", alone)
    with pytest.raises(CheckpointError, match=r"no checkpoint of round 1 .*checkpoint_every: 1"):
        run(job(IMA, 5), resume_from=str(alone), output_dir=tmp_path / "out", branch=True)


SGD = {"epochs": 1, "batch_size": 16, "lr": 0.1}
MOMENTUM = {**SGD, "momentum": 0.5}
# Every inner algorithm the issue and the paper's Table I name, with its placement (as in the authors'
# code: IMA averages FedNova's and FedGMA's outputs; FedAdam/FedYogi step toward the window mean).
TABLE_I = {
    "fedavg": ({"local": MOMENTUM}, "after_server_update"),
    "fedprox": ({"local": MOMENTUM}, "after_server_update"),
    "fedasam": ({"local": MOMENTUM}, "after_server_update"),
    "fedfa": ({"local": MOMENTUM}, "after_server_update"),
    "fednova": ({"local": MOMENTUM}, "after_server_update"),
    "fedgma": ({"local": MOMENTUM}, "after_server_update"),
    "scaffold": ({"local": SGD}, "after_server_update"),  # option II needs plain SGD
    "fedfish": ({"local": MOMENTUM}, "after_server_update"),
    "fedadam": ({"local": MOMENTUM}, "before_server_optimizer"),
    "fedyogi": ({"local": MOMENTUM}, "before_server_optimizer"),
}


@pytest.mark.parametrize("inner", sorted(TABLE_I))
def test_ima_wraps_the_methods_of_the_papers_table_i(inner, tmp_path):
    """Each inner method for 4 rounds, IMA from round 2 with a window of 2."""
    options, placement = TABLE_I[inner]
    algorithm = {"name": "ima", "inner": {"name": inner, **options}, "average_from": 2, "window": 2,
                 "placement": placement}  # fmt: skip
    result = run(job(algorithm, 4), output_dir=tmp_path)
    assert [m["ima/active"] for _, m in result.history] == [0.0, 0.0, 1.0, 1.0]
    assert all(m["ima/shift_norm"] > 0 for _, m in result.history[2:])
    assert all(
        math.isfinite(m["train/loss"]) and math.isfinite(m["eval/clients/loss"]) for _, m in result.history
    )
    assert all(v.isfinite().all() for v in result.state.params.values())
