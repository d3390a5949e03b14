"""Checkpoints round-trip plain server state and refuse what they could not load back."""

import errno
import multiprocessing
import resource
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.checkpoint import (
    CheckpointTrail,
    check_compatible,
    load_checkpoint,
    read_checkpoint,
    read_state,
    round_checkpoint_name,
    round_of_name,
    save_checkpoint,
    snapshot_path,
)
from raysim.errors import CheckpointError
from raysim.models.weights import read_weights
from raysim.runtime.client_state import ClientStateStore
from raysim.types import ServerState


def test_round_trip(tmp_path):
    state = ServerState(
        {"w": torch.arange(3.0)},
        {"step": 2, "m": {"w": torch.ones(3)}},
        {"window": [torch.zeros(1)]},
        frozenset({"bn"}),
    )
    (tmp_path / "elsewhere" / "state").mkdir(parents=True)
    path = save_checkpoint(tmp_path / "c.pt", state, 4, {"name": "x"}, str(tmp_path / "elsewhere" / "state"))
    loaded, round_num, job, state_dir = load_checkpoint(path)
    assert round_num == 4 and job == {"name": "x"} and state_dir == str(tmp_path / "elsewhere" / "state")
    assert torch.equal(loaded.params["w"], state.params["w"]) and loaded.opt_state["step"] == 2
    assert loaded.buffer_keys == frozenset({"bn"})


def test_numpy_in_plugin_state_is_refused_before_writing(tmp_path):
    state = ServerState({"w": torch.zeros(1)}, extra={"anchors": np.zeros(2)})
    with pytest.raises(TypeError, match=r"ServerState\['extra'\]\['anchors'\] is a numpy.ndarray"):
        save_checkpoint(tmp_path / "c.pt", state, 0, {})
    assert not (tmp_path / "c.pt").exists()


@pytest.mark.parametrize("reader", [load_checkpoint, read_state])
def test_a_file_that_is_no_checkpoint_says_what_it_is_not(tmp_path, reader):
    checkpoint = save_checkpoint(tmp_path / "good.pt", ServerState({"w": torch.zeros(2)}), 0, {})
    whole = checkpoint.read_bytes()
    files = {
        "empty.pt": (b"", "empty.pt is empty"),
        "random.pt": (np.random.default_rng(0).bytes(512), "random.pt is not a torch file"),
        "cut.pt": (whole[: len(whole) // 2], "cut.pt is not a torch file"),  # an interrupted copy
        "text.pt": (b"not a checkpoint", "text.pt is not a torch file"),
    }
    for name, (content, message) in files.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match=message):
            reader(tmp_path / name)
    torch.save({"1.weight": torch.zeros(1)}, tmp_path / "weights.pt")  # a model's state dict
    with pytest.raises(
        CheckpointError,
        match=r"weights.pt is a torch file but not a raysim checkpoint \(no 'format', 'state', "
        r"'round_num', 'job'; it holds '1.weight'\)",
    ):
        reader(tmp_path / "weights.pt")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="list.pt is a torch file .* holds a list, not a dict"):
        reader(tmp_path / "list.pt")
    torch.save({"format": 1, "state": {}}, tmp_path / "partial.pt")
    with pytest.raises(
        CheckpointError, match=r"partial.pt .*\(no 'round_num', 'job'; it holds 'format', 'state'\)"
    ):
        reader(tmp_path / "partial.pt")


def test_incompatible_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="does not fit"):
        check_compatible(ServerState({"w": torch.zeros(2)}), {"w": torch.zeros(3)}, "c.pt")


def test_a_snapshot_beside_the_checkpoint_moves_with_it(tmp_path):
    snapshot = tmp_path / "run" / "c.client_state"
    snapshot.mkdir(parents=True)
    save_checkpoint(tmp_path / "run" / "c.pt", ServerState({"w": torch.zeros(1)}), 0, {}, str(snapshot))
    raw = torch.load(tmp_path / "run" / "c.pt", weights_only=True)
    assert raw["state_dir"] == "c.client_state"  # relative to the checkpoint, not to the cwd
    shutil.move(tmp_path / "run", tmp_path / "moved")
    assert load_checkpoint(tmp_path / "moved" / "c.pt")[3] == str(tmp_path / "moved" / "c.client_state")


def test_a_relative_snapshot_path_is_resolved_against_the_checkpoint_not_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "c.client_state").mkdir(parents=True)
    save_checkpoint("out/c.pt", ServerState({"w": torch.zeros(1)}), 0, {}, "out/c.client_state")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    assert load_checkpoint(tmp_path / "out" / "c.pt")[3] == str(tmp_path / "out" / "c.client_state")


def test_a_checkpoint_of_an_older_version_finds_its_snapshot_beside_it(tmp_path):
    """Before, the path was stored relative to the directory the run started in."""
    save_checkpoint(tmp_path / "c.pt", ServerState({"w": torch.zeros(1)}), 0, {}, None)
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    torch.save(raw | {"state_dir": ".raysim/runs/x/checkpoints/c.client_state"}, tmp_path / "c.pt")
    (tmp_path / "c.client_state").mkdir()
    assert load_checkpoint(tmp_path / "c.pt")[3] == str(tmp_path / "c.client_state")


@pytest.mark.parametrize("stored", ["../outside", "..", "sub/../../outside"])
def test_a_relative_snapshot_path_leaving_the_checkpoints_folder_is_refused(tmp_path, stored):
    (tmp_path / "outside").mkdir()  # a folder the path does reach: refused, not merely missing
    (tmp_path / "run" / "sub").mkdir(parents=True)
    path = tmp_path / "run" / "c.pt"
    save_checkpoint(path, ServerState({"w": torch.zeros(1)}), 0, {}, None)
    torch.save(torch.load(path, weights_only=True) | {"state_dir": stored}, path)
    with pytest.raises(CheckpointError, match=r"c.pt names its client-state snapshot .* outside the"):
        load_checkpoint(path)


def test_a_missing_snapshot_is_refused_and_no_snapshot_is_fine(tmp_path):
    save_checkpoint(
        tmp_path / "c.pt", ServerState({"w": torch.zeros(1)}), 0, {}, str(tmp_path / "c.client_state")
    )
    with pytest.raises(
        CheckpointError, match=r"c.pt needs its client-state snapshot .*c.client_state, which is missing"
    ):
        load_checkpoint(tmp_path / "c.pt")
    save_checkpoint(tmp_path / "d.pt", ServerState({"w": torch.zeros(1)}), 0, {}, None)
    assert load_checkpoint(tmp_path / "d.pt")[3] is None


def test_reading_to_evaluate_needs_no_snapshot(tmp_path):
    """``raysim eval`` reads the job and run too, but never client state: its snapshot may be gone."""
    path = save_checkpoint(
        tmp_path / "c.pt",
        ServerState({"w": torch.zeros(1)}),
        2,
        {"name": "x"},
        str(tmp_path / "c.client_state"),
    )
    with pytest.raises(CheckpointError, match="which is missing"):
        read_checkpoint(path)
    found = read_checkpoint(path, with_client_state=False)
    assert (found.round_num, found.job, found.state_dir) == (2, {"name": "x"}, None)


def test_read_state_needs_no_snapshot_and_checks_the_format(tmp_path):
    """Evaluating a checkpoint (raysim analyze, init_from) or reading an earlier round needs the
    server state alone: a missing snapshot is no error there, another format version is (a file
    that is no checkpoint at all: ``test_a_file_that_is_no_checkpoint_says_what_it_is_not``)."""
    state = ServerState({"w": torch.arange(2.0)})
    save_checkpoint(tmp_path / "c.pt", state, 6, {}, str(tmp_path / "c.client_state"))  # not there
    read, round_num = read_state(tmp_path / "c.pt")
    assert round_num == 6 and torch.equal(read.params["w"], state.params["w"])
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    torch.save(raw | {"format": 0}, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="old.pt: checkpoint format 0, expected 1"):
        read_state(tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_state(tmp_path / "absent.pt")


def test_a_trail_reads_earlier_rounds_through_the_same_checks(tmp_path):
    for r in (2, 3):
        save_checkpoint(tmp_path / round_checkpoint_name(r), ServerState({"w": torch.full((1,), r)}), r, {})
    last = read_state(tmp_path / "round_00003.pt")[0]
    trail = CheckpointTrail(tmp_path / "round_00003.pt", 3, last)
    assert trail.state_after(2).params["w"].item() == 2 and trail.state_after(3) is last
    with pytest.raises(CheckpointError, match="no checkpoint of round 1 beside"):
        trail.state_after(1)
    raw = torch.load(tmp_path / "round_00002.pt", weights_only=True)
    torch.save(raw | {"format": 0}, tmp_path / "round_00002.pt")  # the old reader skipped this check
    with pytest.raises(CheckpointError, match="checkpoint format 0"):
        trail.state_after(2)
    torch.save(raw | {"round_num": 5}, tmp_path / "round_00002.pt")
    with pytest.raises(CheckpointError, match="holds round 5, not 2"):
        trail.state_after(2)


def test_round_checkpoint_names_parse_back_to_their_round():
    assert [round_of_name(round_checkpoint_name(r)) for r in (0, 7, 123456)] == [0, 7, 123456]
    assert round_of_name("final.pt") is None and round_of_name("round_7.pt.tmp") is None


def test_a_checkpoint_names_the_mlflow_run_that_wrote_it_and_older_ones_load_without(tmp_path):
    run = {"run_id": "abc", "tracking_uri": "sqlite:///x/mlflow.db"}
    path = save_checkpoint(tmp_path / "c.pt", ServerState({"w": torch.zeros(1)}), 2, {"name": "x"}, None, run)
    found = read_checkpoint(path)
    assert (found.run, found.round_num, found.job, found.path) == (run, 2, {"name": "x"}, path)
    older = torch.load(path, weights_only=True)
    del older["run"]  # what raysim wrote before checkpoints named their run
    torch.save(older, tmp_path / "old.pt")
    assert read_checkpoint(tmp_path / "old.pt").run is None
    assert load_checkpoint(tmp_path / "old.pt")[1] == 2


def flip_middle_byte(path):
    """Damages a file after it was written, keeping its size."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("reader", [read_checkpoint, read_state, read_weights])
def test_one_flipped_byte_is_refused_naming_the_file(tmp_path, reader):
    """torch.load alone would load it as a slightly different model; the archive's CRCs tell."""
    state = ServerState({"w": torch.arange(4096.0)}, {}, {}, frozenset())  # the middle lies in w
    path = save_checkpoint(tmp_path / "final.pt", state, 3, {"name": "x"})
    reader(path)  # intact: reads
    flip_middle_byte(path)
    with pytest.raises(CheckpointError, match=f"{path} is corrupt: its entry .* does not match"):
        reader(path)


@pytest.mark.parametrize("job", [["name", "x"], "x", None])
def test_a_job_entry_that_is_no_mapping_is_refused_naming_the_file(tmp_path, job):
    """--resume and raysim eval ended in an AttributeError traceback (issue 29, item 7)."""
    state = ServerState({"w": torch.zeros(1)}, {}, {}, frozenset())
    path = save_checkpoint(tmp_path / "final.pt", state, 3, job)
    for reader in (read_checkpoint, read_state):
        with pytest.raises(CheckpointError, match=f"{path}: its 'job' entry is a {type(job).__name__}, not"):
            reader(path)


def test_a_round_before_the_first_is_refused_naming_the_file(tmp_path):
    """round_num=-5 used to resume as if five rounds before the start had run."""
    state = ServerState({"w": torch.zeros(1)}, {}, {}, frozenset())
    assert read_state(save_checkpoint(tmp_path / "none.pt", state, -1, {}))[1] == -1  # no round logged
    path = save_checkpoint(tmp_path / "final.pt", state, -5, {"name": "x"})
    for reader in (read_checkpoint, read_state):
        with pytest.raises(CheckpointError, match=f"{path} says it ends after round -5, which no run writes"):
            reader(path)


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),  # torch's
    ],
    ids=["OSError", "torch's RuntimeError"],
)
def test_a_full_disk_leaves_the_previous_checkpoint_and_no_torn_file(tmp_path, monkeypatch, failure):
    """A final.tmp used to be left behind, and the error came as a traceback."""
    state = ServerState({"w": torch.zeros(3)}, {}, {}, frozenset())
    path = save_checkpoint(tmp_path / "final.pt", state, 3, {"name": "x"})
    real_save = torch.save

    def save_until_full(obj, f):
        real_save(obj, f)  # a torn file on disk, as a write that stops part way leaves
        raise failure

    monkeypatch.setattr(torch, "save", save_until_full)
    with pytest.raises(CheckpointError, match=f"could not write the checkpoint {path} .* MiB free there"):
        save_checkpoint(path, ServerState({"w": torch.ones(3)}, {}, {}, frozenset()), 4, {"name": "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.pt"]
    assert read_state(path)[1] == 3


def _checkpoint_with_snapshot(folder, round_num, marker):
    snapshot = folder / f"c.client_state.r{round_num}"
    (snapshot / "0007").mkdir(parents=True)
    if marker is not None:
        (snapshot / "snapshot_round").write_text(f"{marker}\n")
    return save_checkpoint(folder / "c.pt", ServerState({"w": torch.zeros(1)}), round_num, {}, str(snapshot))


def test_a_snapshot_of_another_round_is_refused_naming_both_rounds(tmp_path):
    path = _checkpoint_with_snapshot(tmp_path, 3, marker=5)  # final.pt of round 3, snapshot of round 5
    with pytest.raises(CheckpointError, match=r"c.pt holds round 3 but its client-state snapshot .* '5'"):
        read_checkpoint(path)


def test_a_snapshot_of_its_own_round_or_without_a_marker_loads(tmp_path):
    assert read_checkpoint(_checkpoint_with_snapshot(tmp_path / "a", 3, marker=3)).round_num == 3
    older = _checkpoint_with_snapshot(tmp_path / "b", 3, marker=None)  # written before the marker
    assert read_checkpoint(older).round_num == 3


def _save_under_a_file_size_limit(path, state, limit_bytes, results) -> None:
    """In a forked child: writes stop at ``limit_bytes`` (RLIMIT_FSIZE: the kernel refuses the
    write with EFBIG, as a full disk refuses it with ENOSPC) while the checkpoint is saved."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    try:
        save_checkpoint(path, state, 4, {"name": "x"})
        results.put("written")
    except CheckpointError as exc:
        results.put(str(exc))
    except Exception as exc:  # noqa: BLE001 (what arrives is the point)
        results.put(f"{type(exc).__name__}: {exc}")


def test_a_write_the_kernel_refuses_part_way_keeps_the_previous_checkpoint(tmp_path):
    """A real failed write, not a patched torch.save: the error torch's writer raises is caught."""
    path = save_checkpoint(tmp_path / "final.pt", ServerState({"w": torch.zeros(3)}), 3, {"name": "x"})
    big = ServerState({"w": torch.ones(100_000)})  # 400 kB: the write stops at 64 kB
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_save_under_a_file_size_limit, args=(path, big, 65_536, results))
    child.start()
    said = results.get(timeout=120)
    child.join(timeout=120)
    assert said.startswith(f"could not write the checkpoint {path} (") and "MiB free there" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.pt"]  # no torn final.tmp
    assert read_state(path)[1] == 3


def test_one_flipped_byte_in_a_client_state_file_is_refused_naming_the_file(tmp_path):
    """The per-client files of the snapshot are torch files too: checked once, when resuming."""
    store = ClientStateStore(tmp_path / "client_state")
    store.put(7, 3, {"c": torch.arange(4096.0)})  # the middle byte lies in c
    path = tmp_path / "final.pt"
    snapshot = store.snapshot(snapshot_path(path, 3), 3)
    save_checkpoint(path, ServerState({"w": torch.zeros(1)}), 3, {}, str(snapshot))
    assert read_checkpoint(path).state_dir == str(snapshot)  # intact: reads
    [client_file] = Path(snapshot).glob("*/*/3.pt")
    flip_middle_byte(client_file)
    refusal = f"{client_file} is corrupt: .* client-state snapshot of {path}"
    with pytest.raises(CheckpointError, match=refusal):
        read_checkpoint(path)
    assert read_checkpoint(path, with_client_state=False).round_num == 3  # evaluating reads no client state


def test_an_absolute_snapshot_path_outside_the_checkpoints_folder_is_refused(tmp_path):
    """The snapshot lies beside its checkpoint (docs/reliability.md); an older file moved with its
    snapshot still finds the same-named folder beside it."""
    (tmp_path / "elsewhere" / "c.client_state").mkdir(parents=True)  # a folder the path does reach
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "c.pt"
    stored = str(tmp_path / "elsewhere" / "c.client_state")
    save_checkpoint(path, ServerState({"w": torch.zeros(1)}), 0, {}, stored)
    assert torch.load(path, weights_only=True)["state_dir"] == stored
    with pytest.raises(
        CheckpointError, match=f"c.pt names its client-state snapshot '{stored}', which lies out"
    ):
        read_checkpoint(path)
    (tmp_path / "run" / "c.client_state").mkdir()
    assert read_checkpoint(path).state_dir == str(tmp_path / "run" / "c.client_state")
