"""Loading HuggingFace datasets: each way it fails is one DataError that says what to do."""

import json

import pytest

from raysim.data.hub import load_split
from raysim.errors import DataError


def test_local_files_load(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"text": "hi", "url": "http://x.org"}) + "\n")
    rows = list(load_split("json", split="train", data_files=str(tmp_path / "*.json"), streaming=True))
    assert rows == [{"text": "hi", "url": "http://x.org"}]


def test_patterns_matching_no_file_are_named(tmp_path):
    (tmp_path / "a.json").write_text("{}\n")
    files = {"train": [str(tmp_path / "a.json")], "test": str(tmp_path / "b-*.json")}
    with pytest.raises(
        DataError,
        match=r"no file matches data_files '.*b-\*\.json' \(relative paths start at .*\): give existing",
    ):
        load_split("json", split="test", data_files=files)


def test_files_without_records(tmp_path):
    (tmp_path / "empty.json").touch()
    with pytest.raises(DataError, match="from data_files '.*empty.json': the files hold no records"):
        load_split("json", split="train", data_files=str(tmp_path / "empty.json"))


def test_an_unreachable_hub_says_how_to_go_on(monkeypatch):
    # tests run with HF_HUB_OFFLINE=1, so datasets refuses the hub at once
    with pytest.raises(DataError) as info:
        load_split("uoft-cs/cifar10", split="train", local_hint="use LOCAL files")
    message = str(info.value)
    assert message.startswith("cannot load 'uoft-cs/cifar10' split 'train': the HuggingFace hub cannot")
    assert "HF_HUB_OFFLINE is set" in message and message.endswith("or use LOCAL files")


def test_an_unknown_split_is_a_data_error(tmp_path):
    (tmp_path / "a.json").write_text("{}\n")
    with pytest.raises(DataError, match="split 'validation'.*ValueError"):
        load_split("json", split="validation", data_files=str(tmp_path / "a.json"))


def test_a_malformed_file_names_the_parser_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json\n")
    with pytest.raises(DataError, match="bad.json': ArrowInvalid: JSON parse error"):
        load_split("json", split="train", data_files=str(tmp_path / "bad.json"))
