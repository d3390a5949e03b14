"""``raysim bench`` of a population file: one row per size, each step measured in its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raysim.cli.main import main

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # ~25 s: two fresh processes that import torch
def test_a_population_benchmark_measures_prepare_and_run_per_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # figures go to .raysim/bench/ here
    path = str(REPO / "jobs" / "bench" / "population.yaml")
    small = ["bench.populations=[300]", "engine.cohort_size=5", "engine.num_rounds=2"]
    assert main(["bench", path, *small]) == 0
    [row] = json.loads((tmp_path / ".raysim" / "bench" / "population.json").read_text())
    assert row["num_clients"] == 300
    # peak RSS of a process that imported torch: hundreds of MB, not a number left at zero
    assert row["prepare"]["peak_mb"] > 100 and row["run"]["peak_mb"] > 100
    assert row["run"]["sampling_ms"] > 0 and row["run"]["round_s"] > row["run"]["sampling_ms"] / 1e3
    assert "300" in capsys.readouterr().out
