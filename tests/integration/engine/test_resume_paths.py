"""A checkpoint finds its client-state snapshot beside itself: resuming from another working
directory or after moving the output folder equals the uninterrupted run; a snapshot that went
missing is refused rather than silently resumed without client state."""

import shutil

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.errors import CheckpointError, ConfigError


def scaffold(num_rounds):
    return tiny_job(engine={"num_rounds": num_rounds}, algorithm={"name": "scaffold"})


@pytest.fixture
def interrupted(tmp_path, monkeypatch):
    """The uninterrupted 4-round SCAFFOLD run, and 2 rounds of it run from ``start/`` with the
    default relative output folder (``.raysim``): (whole, path of the 2-round final checkpoint)."""
    whole = run(scaffold(4), output_dir=tmp_path / "whole")
    (tmp_path / "start").mkdir()
    monkeypatch.chdir(tmp_path / "start")
    first = run(scaffold(2))
    [checkpoint] = (tmp_path / "start").glob(".raysim/runs/*/checkpoints/final.pt")
    assert not first.run_dir.is_absolute()  # the case that used to depend on the cwd
    return whole, checkpoint


def assert_same_model(whole, resumed):
    assert [step for step, _ in resumed.history] == [2, 3]
    for k, v in whole.state.params.items():
        assert torch.equal(v, resumed.state.params[k]), k
    assert torch.equal(whole.state.extra.c["1.weight"], resumed.state.extra.c["1.weight"])


def test_resume_from_another_directory_equals_the_uninterrupted_run(tmp_path, monkeypatch, interrupted):
    whole, checkpoint = interrupted
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert_same_model(whole, run(scaffold(4), resume_from=str(checkpoint), output_dir=tmp_path / "r"))


def test_resume_after_moving_the_output_folder_equals_the_uninterrupted_run(
    tmp_path, monkeypatch, interrupted
):
    whole, checkpoint = interrupted
    moved = tmp_path / "archive" / "raysim-output"
    shutil.move(tmp_path / "start" / ".raysim", moved)
    monkeypatch.chdir(tmp_path)
    checkpoint = moved / checkpoint.relative_to(tmp_path / "start" / ".raysim")
    assert_same_model(whole, run(scaffold(4), resume_from=str(checkpoint), output_dir=tmp_path / "r"))


def test_a_missing_client_state_snapshot_is_refused(tmp_path, interrupted):
    _, checkpoint = interrupted
    shutil.rmtree(checkpoint.with_name("final.client_state.r1"))
    with pytest.raises(CheckpointError, match=r"final.client_state.*missing"):
        run(scaffold(4), resume_from=str(checkpoint), output_dir=tmp_path / "r")


def test_an_algorithm_without_client_state_needs_no_snapshot(tmp_path):
    first = run(tiny_job(engine={"num_rounds": 1}), output_dir=tmp_path / "a")
    alone = tmp_path / "copied" / "final.pt"  # only the file, as downloaded from MLflow
    alone.parent.mkdir()
    shutil.copy(first.run_dir / "checkpoints" / "final.pt", alone)
    resumed = run(tiny_job(engine={"num_rounds": 2}), resume_from=str(alone), output_dir=tmp_path / "b")
    assert [step for step, _ in resumed.history] == [1]


def test_resuming_a_finished_run_is_refused_before_any_worker_or_run_starts(tmp_path, monkeypatch):
    first = run(tiny_job(engine={"num_rounds": 2}), output_dir=tmp_path / "a")
    started = []
    monkeypatch.setattr("raysim.engine.build.start_workers", lambda *a: started.append(a))
    with pytest.raises(ConfigError, match=r"completed rounds 0..1.*raise engine.num_rounds above 2"):
        run(
            tiny_job(engine={"num_rounds": 2}),
            resume_from=str(first.run_dir / "checkpoints" / "final.pt"),
            output_dir=tmp_path / "b",
        )
    assert not started and not (tmp_path / "b").exists()  # no workers, no run folder, no MLflow run


def test_a_snapshot_missing_one_clients_file_is_refused_rather_than_resumed_with_a_wrong_model(
    tmp_path, interrupted
):
    """A partial copy of the run folder: one client's SCAFFOLD state gone from the snapshot. It
    used to resume with exit 0 and a model 0.016 off the uninterrupted run's."""
    _, checkpoint = interrupted
    snapshot = checkpoint.with_name("final.client_state.r1")
    lost = sorted(snapshot.glob("*/*/*.pt"))[0]
    lost.unlink()
    with pytest.raises(
        CheckpointError, match=rf"{snapshot}.* {lost.relative_to(snapshot)}.*missing.*earlier"
    ):
        run(scaffold(4), resume_from=str(checkpoint), output_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()  # refused before any worker or run folder
