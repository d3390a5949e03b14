"""The progress display: rounds of this run, the phase, elapsed time."""

import io

import pytest
from rich.console import Console

from raysim.engine.progress import PHASES, RoundProgress


def _bar(num_rounds: int = 10, start_round: int = 0) -> tuple[RoundProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=False, color_system=None)
    return RoundProgress("quickstart", num_rounds, start_round, console=console), out


def test_shows_phase_round_and_accuracy():
    bar, out = _bar()
    with bar:
        assert bar.current_phase == "start-up"  # before any round: the run is being built
        bar.phase("training")
        bar.update(2, {"eval/central/accuracy": 0.8125, "train/loss": 1.0})
        bar.phase("evaluating")
    text = out.getvalue()
    assert "3/10" in text and "evaluating" in text and "central acc 0.812" in text
    assert "0:00:0" in text  # the elapsed-time column


def test_resumed_run_counts_from_the_checkpoint_round():
    bar, out = _bar(num_rounds=10)
    with bar:
        bar.resume_at(6)
        assert bar.progress.tasks[0].total == 4  # only this run's rounds set the ETA
        bar.update(7, {})
        assert bar.progress.tasks[0].completed == 2
    assert "8/10" in out.getvalue()


def test_unknown_phase_is_refused():
    bar, _ = _bar()
    with pytest.raises(ValueError, match="unknown phase"):
        bar.phase("sleeping")
    assert set(PHASES) >= {"start-up", "training", "evaluating", "personalizing"}


def test_a_run_that_fails_to_start_leaves_only_its_error():
    bar, out = _bar()
    with pytest.raises(RuntimeError), bar:
        raise RuntimeError("no data")
    assert "start-up" not in out.getvalue()


def test_a_staged_plugin_shows_its_steps_not_the_jobs_rounds():
    """FuseFL's stages or a one-shot method's steps: the bar stayed at 0/3 (engine.num_rounds)."""
    bar, out = _bar(num_rounds=3)
    with bar:
        bar.staged()
        for step in range(5):  # more steps than the job's rounds
            bar.update(step, {"eval/clients/accuracy": 0.5})
        bar.finished()
        task = bar.progress.tasks[0]
        assert task.completed == task.total == 5
    text = out.getvalue()
    assert "step 4" in text and "0/3" not in text
