"""Runs that differ only in their seed, as one: ``raysim compare --over-seeds``.

Two runs belong together when every param but ``seed`` (and the ``tracking`` and ``resources``
sections: where and how they ran) is equal. A group becomes one record named after its first run
(its ``seed=N`` part dropped) with ``(N seeds)`` added: each final metric and each round's
metric is the mean over the seeds that logged it in every run, and the time the mean time; the
seeds' own records stay in its ``members`` (the cost table's mean ± std).

Usage:
    records = over_seeds(runs, store.records(runs, None))  # runs and records in the same order
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from statistics import fmean
from typing import Any

from raysim.results.tables import RunRecord
from raysim.types import Metrics

_NOT_THE_CONFIG = ("seed", "tracking.", "resources.")
_SEED_PART = re.compile(r"\s*\bseed=\S+")


def config_key(run: Any) -> tuple[tuple[str, str], ...]:
    """The run's params that say what it computes, but its seed."""
    return tuple(sorted((k, v) for k, v in run.data.params.items() if not k.startswith(_NOT_THE_CONFIG)))


def over_seeds(runs: Sequence[Any], records: Sequence[RunRecord]) -> list[RunRecord]:
    """One record per group of runs that differ only in their seed, in the order of each group's
    first run; a run alone keeps its own record."""
    groups: dict[tuple[tuple[str, str], ...], list[tuple[Any, RunRecord]]] = {}
    for run, record in zip(runs, records, strict=True):
        groups.setdefault(config_key(run), []).append((run, record))
    out = []
    for members in groups.values():
        (first_run, first), others = members[0], members[1:]
        out.append(mean_record(first_run.info.run_name, [r for _, r in members]) if others else first)
    return out


def mean_record(name: str, members: Sequence[RunRecord]) -> RunRecord:
    """The members' mean (final metrics, each round's metrics, time), named after ``name``."""
    first = members[0]
    steps = [dict(m.history) for m in members]
    shared = [step for step, _ in first.history if all(step in s for s in steps)]
    seconds = [m.seconds for m in members if m.seconds is not None]
    return RunRecord(
        name=f"{_SEED_PART.sub('', name)} ({len(members)} seeds)",
        algorithm=first.algorithm,
        final=_mean([m.final for m in members]),
        history=[(step, _mean([s[step] for s in steps])) for step in shared],
        seconds=fmean(seconds) if len(seconds) == len(members) else None,
        run_id=",".join(str(m.run_id) for m in members),
        experiment_id=first.experiment_id,
        members=tuple(members),
    )


def _mean(metrics: Sequence[Metrics]) -> Metrics:
    """Each key every mapping holds, averaged."""
    shared = [key for key in metrics[0] if all(key in m for m in metrics)]
    return {key: fmean(m[key] for m in metrics) for key in shared}
