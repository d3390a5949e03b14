"""The source cache: computed once, read back while no source file changes, computed afresh
after any edit or new plugin file."""

from __future__ import annotations

from pathlib import Path

import pytest

from raysim.cli.source_cache import cache_root, cached
from raysim.data.format import default_cache_root


@pytest.fixture
def plugin_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "plugins"
    (root / "algorithms").mkdir(parents=True)
    monkeypatch.setenv("RAYSIM_PLUGIN_PATH", str(root))
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "cache"))
    return root


def test_a_value_is_computed_once_and_again_after_a_plugin_file_changes(plugin_root: Path):
    calls: list[int] = []

    def compute() -> dict[str, int]:
        calls.append(1)
        return {"computed": len(calls)}

    assert cached("t", compute) == {"computed": 1}
    assert cached("t", compute) == {"computed": 1} and len(calls) == 1  # read back
    plugin = plugin_root / "algorithms" / "mine.py"
    plugin.write_text("X = 1\n")
    assert cached("t", compute) == {"computed": 2}  # a new file
    plugin.write_text("X = 22\n")  # its size changes: its time may not, within one clock tick
    assert cached("t", compute) == {"computed": 3}  # an edit
    assert cached("t", compute) == {"computed": 3}


def test_a_torn_cache_file_is_computed_afresh(plugin_root: Path):
    (cache_root() / "t.json").parent.mkdir(parents=True)
    (cache_root() / "t.json").write_text('{"fingerprint": "')
    assert cached("t", lambda: [1]) == [1]
    assert cached("t", lambda: [2]) == [1]


def test_the_cache_root_is_the_stores_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path))
    assert cache_root() == default_cache_root()
    monkeypatch.delenv("RAYSIM_CACHE")
    assert cache_root() == default_cache_root()
