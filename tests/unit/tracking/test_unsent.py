"""A run folder's unsent records (raysim/tracking/unsent.py): every line checked before anything is
sent, a bad one named by file and line; one upload of a folder at a time (issue 29, item 7)."""

import json
import threading
from pathlib import Path

import pytest

from raysim.cli.main import main
from raysim.errors import ResourceError
from raysim.tracking.outbox import UNSENT_FILE, UPLOADED_FILE, EndRecord, MetricsRecord
from raysim.tracking.unsent import claimed, read_unsent, upload

HEADER = {"run_id": "run123", "tracking_uri": "http://tracking:5000"}
METRICS = {"seq": 0, "kind": "metrics", "step": 0, "timestamp": 1000, "metrics": {"train/loss": 1.0}}
END = {"seq": 1, "kind": "end", "status": "FINISHED"}


def unsent_file(folder: Path, *lines: dict) -> Path:
    path = folder / UNSENT_FILE
    path.write_text("".join(json.dumps(line) + "\n" for line in (HEADER, *lines)))
    return path


def test_raysims_own_lines_are_read_with_a_torn_mark_skipped(tmp_path):
    path = unsent_file(tmp_path, METRICS, END)
    with path.open("a") as torn:
        torn.write('{"sent": ')
    unsent = read_unsent(tmp_path)
    assert unsent.records == [(0, MetricsRecord(0, 1000, {"train/loss": 1.0})), (1, EndRecord("FINISHED"))]


@pytest.mark.parametrize(
    "line, says",
    [
        (
            {**METRICS, "kind": "metric"},
            "unknown record kind 'metric' (raysim writes metrics, params, artifact, end)",
        ),
        ({**METRICS, "step": "two"}, "the metrics record's step 'two' is not a whole number"),
        ({**METRICS, "metrics": {"train/loss": None}}, "the metrics record's metrics"),
        ({**METRICS, "seq": True}, "the metrics record's seq 'True' is not a whole number"),
        ({"seq": 1, "kind": "params", "params": {"lr": 0.1}}, "the params record's params"),
        (
            {"seq": 1, "kind": "params", "params": {}, "x": 1},
            "the params record's fields are params, seq, x, not",
        ),
        ({"seq": 1, "kind": "end"}, "the end record's fields are seq, not seq, status"),
        ({**END, "status": "DONE"}, "status 'DONE' is none of FINISHED, FAILED, KILLED"),
        ({"kind": "end", "status": "FINISHED"}, "the end record's fields are status, not seq, status"),
        ("not json at all", "not JSON"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_a_line_raysim_never_writes_is_named_by_file_and_line_and_nothing_is_sent(tmp_path, line, says):
    """Each was a KeyError or TypeError traceback, or went to MLflow as it was."""
    path = unsent_file(tmp_path, METRICS)
    with path.open("a") as out:
        out.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    with pytest.raises(ResourceError) as info:
        read_unsent(tmp_path)
    assert str(info.value).startswith(f"{path}, line 3: ") and says in str(info.value)
    assert "restore the run's own file" in str(info.value)


def test_a_file_that_is_not_text_is_refused_in_one_line(tmp_path):
    (tmp_path / UNSENT_FILE).write_bytes(b"\xff")  # a UnicodeDecodeError traceback before
    with pytest.raises(ResourceError, match=r"not UTF-8 text \(byte 0\); .*restore the run's own file"):
        read_unsent(tmp_path)


def test_a_first_line_naming_no_run_is_refused(tmp_path):
    (tmp_path / UNSENT_FILE).write_text(json.dumps({"run_id": 7}) + "\n")
    with pytest.raises(ResourceError, match="names no MLflow run and store on its first line"):
        read_unsent(tmp_path)


def test_a_second_upload_of_a_folder_is_refused_in_one_line_while_the_first_sends(tmp_path, capsys):
    """Two uploads at once each sent every record (and raced on the rename)."""
    unsent_file(tmp_path, METRICS, END)
    sending, go_on, taken = threading.Event(), threading.Event(), []

    def slow_store(record):
        sending.set()
        go_on.wait(30)
        taken.append(record)

    def first_upload():
        with claimed(tmp_path):
            upload(read_unsent(tmp_path), slow_store)

    first = threading.Thread(target=first_upload)
    first.start()
    try:
        assert sending.wait(30)
        assert main(["track", "upload", str(tmp_path)]) == 2
    finally:
        go_on.set()
        first.join(30)
    err = capsys.readouterr().err
    [line] = err.strip().splitlines()
    assert f"another `raysim track upload` is sending {tmp_path / UNSENT_FILE}" in line
    assert len(taken) == 2 and (tmp_path / UPLOADED_FILE).is_file()
    with claimed(tmp_path):  # once it ended, the folder is free and nothing is left
        assert read_unsent(tmp_path).records == []
