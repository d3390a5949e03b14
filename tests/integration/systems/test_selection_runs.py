"""``engine.selection`` in real runs (serial backend, digits): a run resumed after round 1 picks
the cohorts an uninterrupted run picks, with and without the simulated clock, because the
checkpoint keeps what the selector learned (and the clock's rounds, which cannot be replayed)."""

import json

import pytest

from jobs import tiny_job
from raysim.engine.loop import run

DEVICES = {"examples_per_s": 10, "examples_per_s_sigma": 1.0, "bytes_per_s": 4840, "bytes_per_s_sigma": 0}


def cohorts(result):
    return json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"]


@pytest.mark.parametrize(
    "sections",
    [
        {"engine": {"selection": {"kind": "oort", "epsilon": 0.5}}, "system": {"devices": DEVICES}},
        {
            "engine": {"selection": {"kind": "power_of_choice", "d": 8}},
            "algorithm": {"name": "fedavg", "weighted": False},
        },
    ],
    ids=["oort-on-the-clock", "power-of-choice"],
)
def test_a_resumed_run_picks_the_uninterrupted_runs_cohorts(tmp_path, sections):
    def job(rounds):
        engine = sections["engine"] | {"num_rounds": rounds}
        return tiny_job(**{**sections, "engine": engine, "evaluation": {"every": 0}})

    whole = run(job(4), output_dir=tmp_path / "whole")
    first = run(job(2), output_dir=tmp_path / "first")
    resumed = run(
        job(4), resume_from=str(first.run_dir / "checkpoints" / "final.pt"), output_dir=tmp_path / "r"
    )
    assert cohorts(first) + cohorts(resumed) == cohorts(whole)
    clock = [metrics.get("sys/sim_clock_s") for _, metrics in whole.history]
    assert [metrics.get("sys/sim_clock_s") for _, metrics in resumed.history] == clock[2:]
