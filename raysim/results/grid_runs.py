"""The runs of a grid table, read from MLflow: a sweep's cells, or any runs; and the report
written back to MLflow.

A sweep is named by its id (the ``raysim.sweep`` tag) or by its parent run (id or name, tagged
``raysim.kind=sweep``); its cells are the runs tagged with that ``raysim.sweep``, their axes the
``raysim.axis.*`` tags. A cell run twice (a sweep stopped and resumed) counts once: its latest
finished run, else its latest run. Any other target is resolved as ``raysim compare`` does (a run
id, an experiment's finished runs, a run name); such runs are grouped by their ``raysim.axis.*``
tags when they have them, else by their ``variant`` tag (else ``job``, else their name) and their params.
``raysim eval`` runs are never rows: each evaluates a checkpoint of a training run, which is its row
(the same variant and seed, counted twice, would be refused as a duplicate).

Usage:
    store = RunStore(uri)
    runs, parent = load_runs(store, ["sweep-1a2b"], ["eval/central/accuracy"], print)
    report_run = log_report(store, runs, parent, files, options)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from raysim.results.run_store import KIND_TAG, RunStore
from raysim.results.seed_run import SeedRun
from raysim.tracking.tracking_store import artifact_repository

SWEEP_TAG, CELL_TAG, AXIS_PREFIX = "raysim.sweep", "raysim.cell", "raysim.axis."
SWEEP, REPORT = "sweep", "report"
REPORT_KEY_TAG = "raysim.report_key"  # a hash of the runs and options: one report run each
REPORT_FOLDER = "report"  # the artifacts' folder in the sweep's parent run
EVAL_TAG = (
    "evaluated_checkpoint"  # a `raysim eval` run's (raysim.results.checkpoint_eval.EVALUATED_CHECKPOINT)
)


def load_runs(
    store: RunStore,
    targets: Sequence[str],
    metrics: Sequence[str],
    say: Callable[[str], None] = lambda line: None,
) -> tuple[list[SeedRun], Any]:
    """The runs the targets name with the curves of ``metrics``, and the sweep's parent run
    (None unless every target is one sweep's); ``say`` gets a line when ``raysim eval`` runs
    were left out."""
    found: dict[str, Any] = {}
    parents = []
    loose = []
    for target in targets:
        parent, cells = sweep_of(store, target)
        if cells is None:
            loose.append(target)
            continue
        parents.append(parent)
        for run in latest_per_cell(cells):
            found.setdefault(run.info.run_id, run)
    if loose:
        resolved, _ = store.resolve(loose)
        for run in training_runs(resolved, say):
            found.setdefault(run.info.run_id, run)
    parent = parents[0] if len(parents) == 1 and not loose else None
    names = [run.info.run_name for run in found.values()]
    unique = [names.count(run.info.run_name) == 1 for run in found.values()]
    return [seed_run(store, run, metrics, u) for run, u in zip(found.values(), unique)], parent


def training_runs(runs: Sequence[Any], say: Callable[[str], None]) -> list[Any]:
    """The runs that may be rows: not a sweep's parent, a report, nor a ``raysim eval`` run (those
    are counted in one line to ``say``)."""
    evaluations = [run.info.run_name or run.info.run_id for run in runs if EVAL_TAG in run.data.tags]
    if evaluations:
        more = f" and {len(evaluations) - 3} more" if len(evaluations) > 3 else ""
        say(
            f"left out {len(evaluations)} `raysim eval` run(s) ({', '.join(evaluations[:3])}{more}): "
            "each evaluates a checkpoint of a training run, whose row it would count twice"
        )
    return [
        run
        for run in runs
        if run.data.tags.get(KIND_TAG) not in (SWEEP, REPORT) and EVAL_TAG not in run.data.tags
    ]


def sweep_of(store: RunStore, target: str) -> tuple[Any, list[Any] | None]:
    """(parent run or None, the sweep's cell runs) if ``target`` names a sweep; (None, None) if not."""
    experiments = [e.experiment_id for e in store.client.search_experiments()]
    escaped = target.replace("\\", "\\\\").replace("'", "\\'")
    sweep_id = target
    parents = search_runs(
        store, experiments, f"tags.`{KIND_TAG}` = '{SWEEP}' and tags.`{SWEEP_TAG}` = '{escaped}'"
    )
    if not parents:  # the parent's run id or name
        by_name = search_runs(
            store, experiments, f"tags.`{KIND_TAG}` = '{SWEEP}' and attributes.run_name = '{escaped}'"
        )
        by_id = [
            r
            for r in search_runs(store, experiments, f"attributes.run_id = '{escaped}'")
            if r.data.tags.get(KIND_TAG) == SWEEP
        ]
        parents = by_id or by_name
        if parents:
            sweep_id = parents[0].data.tags.get(SWEEP_TAG, "")
    escaped = sweep_id.replace("\\", "\\\\").replace("'", "\\'")
    cells = [
        r
        for r in search_runs(store, experiments, f"tags.`{SWEEP_TAG}` = '{escaped}'")
        if r.data.tags.get(KIND_TAG) != SWEEP
    ]
    if not cells and not parents:
        return None, None
    return (parents[0] if parents else None), cells


def search_runs(store: RunStore, experiment_ids: list[str], query: str) -> list[Any]:
    """Every run matching ``query`` (an MLflow filter), newest first, over all pages."""
    found: list[Any] = []
    token = None
    while True:
        page = store.client.search_runs(
            experiment_ids, query, order_by=["attributes.start_time DESC"], page_token=token
        )
        found += list(page)
        token = page.token
        if not token:
            return found


def latest_per_cell(runs: Sequence[Any]) -> list[Any]:
    """One run per ``raysim.cell`` (runs come newest first): the latest finished, else the latest."""
    kept: dict[str, Any] = {}
    for run in runs:
        cell = run.data.tags.get(CELL_TAG, run.info.run_id)
        earlier = kept.get(cell)
        if earlier is None or (earlier.info.status != "FINISHED" and run.info.status == "FINISHED"):
            kept[cell] = run
    return list(kept.values())[::-1]  # oldest first


def seed_run(store: RunStore, run: Any, metrics: Sequence[str], unique: bool = True) -> SeedRun:
    """The run with the curves of ``metrics``; a name several runs share gets an id suffix."""
    tags, info = run.data.tags, run.info
    axes = {k[len(AXIS_PREFIX) :]: v for k, v in tags.items() if k.startswith(AXIS_PREFIX)}
    params = dict(run.data.params)
    params.setdefault("variant", tags.get("variant") or tags.get("job") or info.run_name or info.run_id)
    curves = {}
    for key in dict.fromkeys(metrics):
        if key in run.data.metrics:
            points = sorted(
                store.client.get_metric_history(info.run_id, key), key=lambda m: (m.step, m.timestamp)
            )
            latest = {p.step: p.value for p in points}  # a resumed run repeats its last round
            curves[key] = tuple(sorted(latest.items()))
    return SeedRun(
        run_id=info.run_id,
        name=(info.run_name or info.run_id) if unique else f"{info.run_name} ({info.run_id[:8]})",
        axes=axes,
        failed=info.status != "FINISHED",
        curves=curves,
        params=params,
        seconds=(info.end_time - info.start_time) / 1000 if info.end_time else None,
        logged=frozenset(run.data.metrics),
    )


def log_report(
    store: RunStore,
    runs: Sequence[SeedRun],
    parent: Any,
    files: Sequence[Path],
    options: Sequence[str],
    note: str,
) -> Any:
    """The files as artifacts of the sweep's parent run (under ``report/``), else of a report run
    in the first run's experiment, tagged ``raysim.kind=report``: one per set of runs and options,
    reused (its files replaced) when the same report is made again."""
    if parent is not None:
        target, folder = parent, REPORT_FOLDER
    else:
        ids = ",".join(sorted(r.run_id for r in runs))
        key = hashlib.sha1("|".join([ids, *options]).encode()).hexdigest()
        experiment = str(store.client.get_run(runs[0].run_id).info.experiment_id)
        earlier = search_runs(store, [experiment], f"tags.`{REPORT_KEY_TAG}` = '{key}'")
        tags = {KIND_TAG: REPORT, REPORT_KEY_TAG: key, "mlflow.note.content": note[:8000]}
        target = earlier[0] if earlier else store.client.create_run(experiment, run_name="report", tags=tags)
        folder = None
    artifacts = artifact_repository(store.uri, target.info.run_id)
    for path in files:
        artifacts.log_artifact(str(path), folder)
    if parent is None and target.info.status != "FINISHED":
        store.client.set_terminated(target.info.run_id, "FINISHED")
    return target
