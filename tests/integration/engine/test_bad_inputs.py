"""Inputs that used to go wrong quietly: a job name that reaches outside --output-dir, a NaN
checkpoint resumed (blamed on the clients), a training loss of 4e26 from a finite model (no word)."""

import logging
from dataclasses import replace

import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.checkpoint import read_checkpoint, save_checkpoint
from raysim.engine import engine as engine_module
from raysim.engine.loop import run
from raysim.errors import CheckpointError, ConfigError, ResourceError


def test_a_job_name_cannot_put_its_run_folder_outside_the_output_dir(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"name: names the run folder.*\(got '../../../escaped_job'\)"):
        run(tiny_job(name="../../../escaped_job"), output_dir=tmp_path / "a" / "b" / "out")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]  # nothing written anywhere


def test_resuming_a_nan_checkpoint_names_the_file_and_tensors_before_any_training(tmp_path, monkeypatch):
    first = run(tiny_job(engine={"num_rounds": 2}), output_dir=tmp_path)
    saved = read_checkpoint(first.run_dir / "checkpoints" / "final.pt")
    poisoned = {name: torch.full_like(value, torch.nan) for name, value in saved.state.params.items()}
    nan = replace(saved.state, params=poisoned)
    path = save_checkpoint(tmp_path / "nan.pt", nan, saved.round_num, saved.job, None)
    trained = []
    monkeypatch.setattr(engine_module.Engine, "train_cohort", lambda *a, **k: trained.append(1))
    tensor = next(iter(nan.params))
    with pytest.raises(CheckpointError, match=rf"nan.pt is non-finite: params/{tensor}, .* hold NaN or inf"):
        run(tiny_job(engine={"num_rounds": 4}), resume_from=str(path), output_dir=tmp_path)
    assert not trained


def test_a_huge_training_loss_from_a_finite_model_warns_once_and_the_run_ends(tmp_path, monkeypatch, caplog):
    real = engine_module.round_metrics
    monkeypatch.setattr(engine_module, "round_metrics", lambda *a: real(*a) | {"train/loss": 4e26})
    with caplog.at_level(logging.WARNING, logger="raysim"):
        result = run(tiny_job(engine={"num_rounds": 3}), output_dir=tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "diverging" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("round 0: train/loss is 4e+26")
    assert [step for step, _ in result.history] == [0, 1, 2] and P.is_finite(result.state.params)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_gpu_request_on_a_machine_without_one_is_refused_before_training(tmp_path):
    job = tiny_job(resources={"backend": "serial", "gpus_per_worker": 0.5})
    with pytest.raises(
        ResourceError,
        match="asks for a GPU, but this machine has no CUDA device; set resources.gpus_per_worker to 0",
    ):
        run(job, output_dir=tmp_path)
    assert not list(tmp_path.rglob("checkpoint*"))  # nothing trained


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_measured_gpu_share_on_a_machine_without_one_is_refused_before_training(tmp_path):
    job = tiny_job(resources={"backend": "serial", "gpus_per_worker": "auto"})
    with pytest.raises(ResourceError, match="auto measures a worker on a GPU, and this machine has none"):
        run(job, output_dir=tmp_path)
    assert not list(tmp_path.rglob("checkpoint*"))  # nothing trained
