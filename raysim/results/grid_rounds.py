"""How far the runs of a grid table went: ``--at-round R`` needs each run's value after R rounds,
and runs of different lengths in one column compare a short run's final value with a long one's
(``raysim.results.grid_table.mixed_lengths`` warns of those).

Rounds count as ``--target``'s do (``raysim.results.grid_cost``): a value logged at round r was
reached after r + 1 rounds, so the value after R rounds is the one logged at round R - 1, and
after 0 rounds the initial model's (``evaluation.at_start``, logged at round -1).

Usage:
    check_reached(runs, ["eval/central/accuracy"], 3)   # raises, naming the runs that did not
"""

from __future__ import annotations

from collections.abc import Sequence

from raysim.errors import RaysimError
from raysim.results.seed_run import Curve, SeedRun

_NAMED = 5  # runs named in an error; the rest are counted


def rounds_of(curve: Curve) -> int:
    """Rounds a curve reached: its last logged round + 1 (0 for the initial model's value alone)."""
    return max((step for step, _ in curve), default=-1) + 1


def value_after(curve: Curve, rounds: int) -> float | None:
    """The value logged after ``rounds`` rounds (at round ``rounds - 1``); None if none was."""
    values = [value for step, value in curve if step == rounds - 1]
    return values[-1] if values else None


def check_reached(runs: Sequence[SeedRun], metrics: Sequence[str], rounds: int) -> None:
    """Every finished run has a value of each metric after ``rounds`` rounds.

    Raises:
        RaysimError: one line naming the runs that stopped before, and those that reached the
            round without logging the metric there (evaluated every few rounds).
    """
    for metric in metrics:
        curves = {r.name: r.curves[metric] for r in runs if not r.failed and metric in r.curves}
        short = {name: rounds_of(c) for name, c in curves.items() if rounds_of(c) < rounds}
        unlogged = [n for n, c in curves.items() if n not in short and value_after(c, rounds) is None]
        problems = []
        if short:
            named = list(short.items())[:_NAMED]
            listed = ", ".join(f"{name} ({n} {plural(n, 'round')})" for name, n in named)
            problems.append(
                f"{len(short)} of {len(curves)} runs did not reach it: {listed}{_more(short)}; "
                f"the most every run reached is {min(map(rounds_of, curves.values()))}"
            )
        if unlogged:
            listed = ", ".join(unlogged[:_NAMED])
            problems.append(f"{listed}{_more(unlogged)} did not evaluate {metric} then (evaluation.every)")
        if problems:
            after = f"after {rounds} {plural(rounds, 'round')}"
            raise RaysimError(f"--at-round {rounds}: no value of {metric} {after}: {'; '.join(problems)}")


def plural(n: int, word: str) -> str:
    """``word`` for one, ``words`` for any other count."""
    return word if n == 1 else f"{word}s"


def _more(names: Sequence[str] | dict[str, int]) -> str:
    return f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
