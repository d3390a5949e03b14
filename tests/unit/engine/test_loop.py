"""What ``raysim.run`` checks before anything is built; and that every registered algorithm runs
from a two-line job (``algorithm`` and ``dataset: digits``) with
the model its plugin or the recipe names, for two rounds on the serial backend, not only
validates (tests/unit/config/test_job_default_model.py). Each client trains 33 examples a round:
at the default batch size of 32 (and 16, 8, ...) its last batch is one example, which BatchNorm
refuses in train mode unless ``raysim.train.batching`` handles it. The overrides keep the runs
small (two clients, two rounds, one evaluated client) and leave model and batch size alone."""

import math

import pytest

import raysim.engine.loop as loop
from raysim import registry
from raysim.config import JobConfig, deep_merge
from raysim.errors import ResourceError

# what makes a plugin's own long schedule short; never its model or local batch size
LIGHT = {
    "ima": {"inner": {"name": "fedavg"}, "average_from": 1, "window": 1},  # required options
    "dense": {"epochs": 1, "synthesis": {"steps": 1, "batch_size": 8}, "batch_size": 8},
    "feddf": {"distill": {"steps": 2}},
    "soups": {"num_models": 2},
    "diwa": {"num_models": 2},
}
SMALL = {
    "dataset": {"partition": {"num_clients": 20}},  # about 90 examples each, before the cap
    "engine": {"num_rounds": 2, "cohort_size": 2, "max_client_examples": 33},
    "evaluation": {"clients": 2},
    "resources": {"backend": "serial"},
    "tracking": {"enabled": False, "progress": False},
}


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The learning-curve PNGs cost more than the training here; nothing below reads them."""
    monkeypatch.setattr(loop, "learning_curve", lambda history, title, path: path.touch() or path)
    monkeypatch.setattr(loop, "time_per_round", lambda history, title, path: None)


def run_two_line_job(tmp_path, algorithm: dict, **sections) -> loop.RunResult:
    job = deep_merge(deep_merge({"dataset": {"name": "digits"}, "algorithm": algorithm}, SMALL), sections)
    return loop.run(JobConfig.from_dict(job), output_dir=tmp_path)


@pytest.mark.parametrize("name", registry.names("algorithm"))
def test_every_algorithm_runs_two_rounds_from_a_two_line_job(name, tmp_path):
    result = run_two_line_job(tmp_path, {"name": name, **LIGHT.get(name, {})})
    assert result.job.model.name  # the plugin's or the recipe's default model trained
    assert result.history and all(math.isfinite(v) for _, m in result.history for v in m.values())


@pytest.mark.parametrize("batch_size,examples", [(10, 31), (16, 33), (32, 33)])
def test_fedavg_trains_a_batchnorm_resnet_whose_clients_end_on_a_batch_of_one(batch_size, examples, tmp_path):
    """FedAvg on resnet10 (BatchNorm after a 1x1 feature map on 8x8 digits): every client's last
    batch of every epoch is one example, merged into the batch before it."""
    algorithm = {"name": "fedavg", "local": {"batch_size": batch_size}}
    model = {"name": "resnet10", "width": 8}
    result = run_two_line_job(tmp_path, algorithm, model=model, engine={"max_client_examples": examples})
    train = [m for _, m in result.history if "train/steps" in m]
    assert train and all(m["train/steps"] == examples // batch_size for m in train)  # one step fewer
    assert all(m["train/num_examples"] == examples for m in train)  # and no example left out


def test_an_output_dir_whose_runs_folder_cannot_be_made_is_refused_before_the_data(tmp_path, monkeypatch):
    """The run folder's mkdir failed with a traceback after the data was prepared (issue 29, item 7)."""
    (tmp_path / "runs").write_text("")  # where the run folders go
    monkeypatch.setattr(loop, "build", lambda *args: pytest.fail("built the run before the check"))
    job = JobConfig.from_dict(
        {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    )
    with pytest.raises(ResourceError, match=f"holds a file {tmp_path / 'runs'} where raysim makes a folder"):
        loop.run(job, output_dir=tmp_path)


def test_a_jobs_note_is_printed_when_its_run_starts(tmp_path, capsys):
    """A job whose known behaviour surprises says so on the console, not only in its file."""
    note = "scores near chance from a random start: see docs/papers.md"
    run_two_line_job(tmp_path, {"name": "fedavg"}, note=note, engine={"num_rounds": 1}, model={"name": "mlp"})
    assert f"note (job): {note}" in " ".join(capsys.readouterr().err.split())
