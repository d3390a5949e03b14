"""``raysim eval``'s argument resolution and its refusal of overrides that would change the model or
the data partition (the evaluation itself: tests/integration/cli/test_eval_cli.py)."""

import pytest
import torch

from raysim.checkpoint import save_checkpoint
from raysim.errors import CheckpointError, ConfigError, RaysimError
from raysim.results.checkpoint_eval import (
    evaluate_checkpoint,
    evaluation_job,
    find_checkpoint,
    refuse_fixed_overrides,
)
from raysim.types import ServerState

SAVED = {
    "name": "tiny",
    "dataset": {"name": "digits"},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "local", "init": "shared"},  # "init: shared" is today's start_from
    "evaluation": {"clients": 10},
}


def checkpoint(path, round_num=1):
    return save_checkpoint(path, ServerState({"w": torch.arange(4096.0)}), round_num, SAVED)


def test_a_checkpoint_file_is_itself(tmp_path):
    path = checkpoint(tmp_path / "round_00001.pt")
    assert find_checkpoint(str(path), None, tmp_path) == path


def test_a_run_folder_and_its_checkpoints_folder_give_its_final_checkpoint(tmp_path):
    run = tmp_path / "runs" / "tiny-20260101-000000-abcdef"
    final = checkpoint(run / "checkpoints" / "final.pt")
    checkpoint(run / "checkpoints" / "round_00000.pt", 0)
    assert find_checkpoint(str(run), None, tmp_path) == final
    assert find_checkpoint(str(run / "checkpoints"), None, tmp_path) == final


def test_a_run_folder_without_a_final_checkpoint_names_its_latest_round(tmp_path):
    run = tmp_path / "unfinished"
    checkpoint(run / "checkpoints" / "round_00000.pt", 0)
    checkpoint(run / "checkpoints" / "round_00003.pt", 3)
    with pytest.raises(CheckpointError, match=r"no checkpoints/final.pt; its latest .*round_00003.pt, pass"):
        find_checkpoint(str(run), None, tmp_path)
    (tmp_path / "unrelated").mkdir()
    with pytest.raises(CheckpointError, match=r"unrelated is a folder but no finished run folder"):
        find_checkpoint(str(tmp_path / "unrelated"), None, tmp_path)


def test_what_is_neither_a_path_nor_a_run_id_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="is neither a checkpoint file nor a run folder"):
        find_checkpoint(str(tmp_path / "missing.pt"), None, tmp_path)


def test_a_run_id_is_looked_up_in_the_store(tmp_path):
    """A run id is looked for in the given store; a store that is not there is named."""
    missing = tmp_path / "nowhere.db"
    with pytest.raises(RaysimError, match=f"no MLflow store at {missing}"):
        find_checkpoint("0123456789abcdef0123456789abcdef", f"sqlite:///{missing}", tmp_path)


@pytest.mark.parametrize("uri", ["ftp://x", "sqlite:/x.db", "not-sqlite"])
def test_a_store_raysim_cannot_read_is_one_error_and_no_store_is_made(tmp_path, uri):
    """raysim eval and analyze made a 1-byte file an MLflow store; the others were tracebacks
    (issue 29, item 7)."""
    if uri == "not-sqlite":
        (tmp_path / "notes.db").write_bytes(b"x")
        uri = f"sqlite:///{tmp_path / 'notes.db'}"
    with pytest.raises(RaysimError, match=r"no SQLite URI|no store for the scheme|not a SQLite database"):
        find_checkpoint("0123456789abcdef0123456789abcdef", uri, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == (["notes.db"] if "notes" in uri else [])


def test_evaluation_resources_and_tracking_may_change():
    refuse_fixed_overrides(
        ["evaluation.clients=50", "evaluation.personalization.epochs=2", "resources.backend=serial",
         "tracking.experiment=x"], "c.pt",
    )  # fmt: skip


def test_what_would_change_the_model_or_the_partition_is_refused_each_by_its_key():
    refused = ["model.hidden=[8]", "dataset.partition.alpha=0.1", "seed=1", "engine.num_rounds=5",
               "evaluation.heldout_fraction=0.2", "algorithm.local.lr=1"]  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        refuse_fixed_overrides([*refused, "evaluation.clients=3"], "c.pt")
    keys = [problem.split(":")[0] for problem in caught.value.problems]
    assert keys == [item.split("=")[0] for item in refused]
    assert "override only evaluation.* (not heldout_fraction), resources.* or tracking.*" in str(caught.value)


def test_the_saved_job_is_upgraded_and_overridden():
    job = evaluation_job(SAVED, ["evaluation.clients=3", "resources.backend=serial"], "c.pt")
    assert job.evaluation.clients == 3 and job.resources.backend == "serial"
    assert job.algorithm.config.start_from == "shared_init"  # an option renamed since: today's name
    assert job.model.to_dict()["hidden"] == [16]  # the checkpoint's model


def test_a_corrupt_checkpoint_is_refused_by_its_checksum_before_anything_opens(tmp_path):
    path = checkpoint(tmp_path / "final.pt")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # in the middle of w: the archive's CRC-32 tells
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"final.pt is corrupt: its entry .* does not match"):
        evaluate_checkpoint(path, [])


def test_a_refused_override_comes_before_the_data_is_opened(tmp_path):
    """The saved job's dataset does not exist here: the refusal must come first."""
    path = save_checkpoint(
        tmp_path / "final.pt", ServerState({"w": torch.zeros(1)}), 0, {**SAVED, "dataset": {"name": "nope"}}
    )
    with pytest.raises(ConfigError, match="model.name: cannot change"):
        evaluate_checkpoint(path, ["model.name=cnn"])


class DataOpened(Exception):
    """Raised in place of opening the data: the refusals under test must come before it."""


@pytest.fixture
def no_data(monkeypatch):
    def refuse(job):
        raise DataOpened

    monkeypatch.setattr("raysim.results.checkpoint_eval.open_parts", refuse)


def test_a_non_finite_checkpoint_is_refused_as_resume_refuses_it(tmp_path, no_data):
    path = save_checkpoint(
        tmp_path / "final.pt", ServerState({"w": torch.full((4,), float("nan"))}), 1, SAVED
    )
    with pytest.raises(CheckpointError) as error:
        evaluate_checkpoint(path, ["tracking.enabled=false"])
    message = str(error.value)
    assert "\n" not in message and f"{path} is non-finite: params/w holds NaN" in message
    assert "evaluate an earlier checkpoint of the run" in message


@pytest.mark.parametrize("round_num", [10**12, 10, -1])  # SAVED's engine.num_rounds: the default, 10
def test_a_round_its_job_never_runs_is_refused_naming_the_file_and_the_rounds(tmp_path, no_data, round_num):
    path = checkpoint(tmp_path / "final.pt", round_num)
    with pytest.raises(CheckpointError) as error:
        evaluate_checkpoint(path, ["tracking.enabled=false"])
    message = str(error.value)
    assert "\n" not in message and f"{path} says it ends after round {round_num}" in message
    assert "rounds 0..9" in message and "evaluate another checkpoint of the run" in message


def test_the_first_and_last_rounds_of_its_job_are_evaluated(tmp_path, no_data):
    for round_num in (0, 9):
        with pytest.raises(DataOpened):  # past the checks
            evaluate_checkpoint(
                checkpoint(tmp_path / f"r{round_num}.pt", round_num), ["tracking.enabled=false"]
            )


def test_a_staged_methods_last_step_counts_its_stages_not_engine_num_rounds(tmp_path, no_data):
    """FuseFL logs its K stages and CCVR at steps 0..K, whatever engine.num_rounds says."""
    fusefl = {
        **SAVED,
        "model": {"name": "resnet10", "width": 4},
        "algorithm": {"name": "fusefl"},
        "engine": {"num_rounds": 1},
    }
    stages = evaluation_job(fusefl, [], "c.pt").algorithm.config.num_stages
    path = save_checkpoint(tmp_path / "final.pt", ServerState({"w": torch.zeros(1)}), stages, fusefl)
    with pytest.raises(DataOpened):
        evaluate_checkpoint(path, ["tracking.enabled=false"])
    beyond = save_checkpoint(tmp_path / "beyond.pt", ServerState({"w": torch.zeros(1)}), stages + 1, fusefl)
    with pytest.raises(CheckpointError, match=f"rounds 0..{stages}"):
        evaluate_checkpoint(beyond, ["tracking.enabled=false"])
