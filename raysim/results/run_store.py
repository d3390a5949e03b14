"""The MLflow side of ``raysim compare``: runs found by id, name or experiment, their metrics
fetched, and the comparison logged back as a run of its own.

A target is tried as a run id, then as an experiment name or id (its FINISHED runs), then as a run
name (the latest run of that name, in any experiment). Comparison runs (tagged
``raysim.kind=comparison``) are never compared themselves.

Usage:
    store = RunStore(uri)
    runs = store.resolve(["quickstart", "3f2c...", "job/variant"])
    records = store.records(runs, metrics=None)        # histories of the curves' metrics only
    run = store.log_comparison(records, [png, csv])    # a new run holding the files
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from raysim.engine.preflight import check_existing_tracking_store
from raysim.engine.round_timer import WALL
from raysim.errors import RaysimError
from raysim.results.tables import RunRecord, curve_keys, default_metrics, logged_keys, markdown
from raysim.tracking.links import run_link, ui_base
from raysim.tracking.outbox import outage_reason
from raysim.tracking.store_calls import bound_store_calls
from raysim.tracking.tracking_store import artifact_repository
from raysim.types import Metrics

KIND_TAG = "raysim.kind"
COMPARISON = "comparison"
COMPARED_RUNS_TAG = "raysim.compared_runs"
COMPARISON_KEY_TAG = "raysim.comparison_key"  # a hash of the compared runs and options: one run each
RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id (fullmatch)
_NEWEST_FIRST = "attributes.start_time DESC"
_MAX_TAG_CHARS = 8000  # MLflow's limit on a tag value
_ALWAYS_FETCHED = ("sys/clients_per_s", "train/loss", WALL)  # the table's clients/s, rounds, time
STORE_HINT = "pass --tracking-uri (or set MLFLOW_TRACKING_URI) to the store the runs were logged to"
# where a run is looked up by id or name: `raysim run --resume` has no --tracking-uri of its own
WHICH_STORE = "--tracking-uri (raysim run: tracking.tracking_uri=URI) or MLFLOW_TRACKING_URI"


class RunStore:
    """An MLflow store read by ``raysim compare``, ``runs`` and ``report`` (and written once, for
    the comparison or report run).

    Raises:
        RaysimError: a URI raysim cannot use; no MLflow store in the SQLite file at ``uri`` (missing,
            empty, not SQLite, no MLflow tables); a server (or database server) that does not
            answer within seconds (``raysim.engine.preflight``).
    """

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        bound_store_calls()  # a server that dies later costs seconds a call, not minutes
        check_existing_tracking_store(uri, STORE_HINT)  # MLflow would make a store of a missing file
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)

    # --- finding runs --------------------------------------------------------------------------

    def resolve(self, targets: Sequence[str]) -> tuple[list[Any], list[str]]:
        """The MLflow runs the targets name, each once, in order; and notes on ambiguous names.

        Raises:
            RaysimError: a target is no run id, experiment or run name in the store.
        """
        runs: dict[str, Any] = {}
        notes: list[str] = []
        for target in targets:
            for run in self._runs_of(target, notes):
                runs.setdefault(run.info.run_id, run)
        if not runs:
            raise RaysimError(f"no runs to compare in {', '.join(targets)}")
        return list(runs.values()), notes

    def _runs_of(self, target: str, notes: list[str]) -> list[Any]:
        if RUN_ID.fullmatch(target):
            run = self._run(target)
            if run is not None:
                return [run]
        experiment = self._experiment(target)
        if experiment is not None:
            found = self._search([experiment.experiment_id], "attributes.status = 'FINISHED'")
            found = [run for run in found if not is_comparison(run)][::-1]  # oldest first
            if not found:
                raise RaysimError(f"experiment {experiment.name!r} has no finished runs to compare")
            return found
        escaped = target.replace("\\", "\\\\").replace("'", "\\'")
        named = [
            r
            for r in self._search(self._experiment_ids(), f"attributes.run_name = '{escaped}'")
            if not is_comparison(r)
        ]
        if not named:
            experiments = ", ".join(repr(e.name) for e in self.client.search_experiments())
            raise RaysimError(
                f"{target!r} is no run id, experiment or run name in {self.uri} (experiments: "
                f"{experiments or 'none'}); copy a run id from `raysim run` or the MLflow UI"
            )
        if len(named) > 1:
            notes.append(
                f"{len(named)} runs are named {target!r}: comparing the latest, {named[0].info.run_id} "
                f"(name the others by run id)"
            )
        return named[:1]

    def _run(self, run_id: str) -> Any | None:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id)
        except MlflowException as exc:
            if outage_reason(exc) is not None:  # the store is away: not "no such run"
                raise
            return None

    def _experiment(self, name_or_id: str) -> Any | None:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name_or_id)
        if experiment is None and name_or_id.isdigit():
            try:
                experiment = self.client.get_experiment(name_or_id)
            except MlflowException as exc:
                if outage_reason(exc) is not None:
                    raise
                return None
        return experiment

    def _experiment_ids(self) -> list[str]:
        return [e.experiment_id for e in self.client.search_experiments()]

    def _search(self, experiment_ids: list[str], query: str) -> list[Any]:
        return search_runs(self.client, experiment_ids, query)

    def listing(self, experiment: str | None = None, where: Sequence[str] = ()) -> list[Any]:
        """The store's runs (of one experiment, by name or id), newest first, comparisons aside,
        those matching every ``key=value`` of ``where`` only (``raysim runs``).

        Raises:
            RaysimError: no such experiment, or a condition that is no ``key=value``.
        """
        conditions = parse_where(where)
        if experiment is None:
            ids = self._experiment_ids()
        elif (found := self._experiment(experiment)) is not None:
            ids = [found.experiment_id]
        else:
            names = ", ".join(repr(e.name) for e in self.client.search_experiments())
            raise RaysimError(f"no experiment {experiment!r} in {self.uri}; experiments: {names or 'none'}")
        return [r for r in self._search(ids, "") if not is_comparison(r) and matches(r, conditions)]

    # --- reading them ----------------------------------------------------------------------------

    def records(
        self, runs: Sequence[Any], metrics: Sequence[str] | None, extra: Sequence[str] = ()
    ) -> list[RunRecord]:
        """The runs as records: final metrics, and the histories of the metrics to draw (the
        ``metrics`` named, else each task's main one), of those the table derives from and of
        the ``extra`` keys (the cost table's)."""
        finals = [
            RunRecord(
                name=run.info.run_name or run.info.run_id,
                algorithm=run.data.tags.get("algorithm") or run.data.params.get("algorithm.name", "?"),
                final=dict(run.data.metrics),
                history=[],
                seconds=(run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else None,
                run_id=run.info.run_id,
                experiment_id=run.info.experiment_id,
            )
            for run in runs
        ]
        drawn = list(metrics or default_metrics(finals))
        wanted = [
            *_ALWAYS_FETCHED,
            *extra,
            *(k for m in drawn for _, key in curve_keys(m) for k in logged_keys(key)),
        ]
        records = []
        for record in unique_names(finals):
            keys = [key for key in dict.fromkeys(wanted) if key in record.final]
            history = self.history(str(record.run_id), keys)
            records.append(replace(record, history=history))
        return records

    def history(self, run_id: str, keys: Sequence[str]) -> list[tuple[int, Metrics]]:
        """(round, {key: value}) for every round a key was logged at; the latest value of a round
        logged twice (a resumed run repeats its last round)."""
        rounds: dict[int, Metrics] = {}
        for key in keys:
            points = sorted(self.client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
            for point in points:
                rounds.setdefault(point.step, {})[key] = point.value
        return sorted(rounds.items())

    # --- writing the comparison ----------------------------------------------------------------

    def log_comparison(
        self, records: Sequence[RunRecord], files: Sequence[Path], options: Sequence[str] = ()
    ) -> Any:
        """The comparison's run in the first compared run's experiment, named ``compare/<run
        names>``, tagged ``raysim.kind=comparison`` and ``raysim.compared_runs`` (the run ids), with
        the table as its description and ``files`` as artifacts. The same runs compared with the
        same ``options`` again reuse their run (``raysim.comparison_key``), its files replaced."""
        ids = ",".join(str(r.run_id) for r in records)
        key = hashlib.sha1("|".join([ids, *options]).encode()).hexdigest()
        table = markdown(records)
        tags = {
            KIND_TAG: COMPARISON,
            COMPARED_RUNS_TAG: ids if len(ids) <= _MAX_TAG_CHARS else f"{len(records)} runs: see the CSV",
            COMPARISON_KEY_TAG: key,
            "mlflow.note.content": table if len(table) <= _MAX_TAG_CHARS else "see final_metrics.md",
        }
        experiment = str(records[0].experiment_id)
        earlier = self._search([experiment], f"tags.`{COMPARISON_KEY_TAG}` = '{key}'")
        if earlier:
            run = earlier[0]
            for tag, value in tags.items():  # the note holds the table as it reads now
                self.client.set_tag(run.info.run_id, tag, value)
        else:
            name = "compare/" + ",".join(r.name for r in records)
            run = self.client.create_run(
                experiment, run_name=name if len(name) <= 200 else name[:199] + "…", tags=tags
            )
        artifacts = artifact_repository(self.uri, run.info.run_id)  # right from any working directory
        for path in files:
            artifacts.log_artifact(str(path))
        if not earlier:
            self.client.set_terminated(run.info.run_id, "FINISHED")
        return run

    def link(self, experiment_id: str, run_id: str) -> str:
        """The run's page in the MLflow UI: the tracking server's, else ``raysim ui``'s address."""
        return run_link(ui_base(self.uri), experiment_id, run_id)


def search_runs(client: Any, experiment_ids: list[str], query: str) -> list[Any]:
    """Every run matching ``query``, newest first (all pages)."""
    found: list[Any] = []
    token = None
    while True:
        page = client.search_runs(experiment_ids, query, order_by=[_NEWEST_FIRST], page_token=token)
        found += list(page)
        token = page.token
        if not token:
            return found


def run_named(client: Any, name: str, uri: str) -> Any:
    """The one run named ``name`` in the store (comparisons aside): ``--resume`` and ``raysim
    analyze`` take a run name where they take a run id.

    Raises:
        RaysimError: no run has that name, or several do (each listed, to pick one by id).
    """
    experiments = [e.experiment_id for e in client.search_experiments()]
    escaped = name.replace("\\", "\\\\").replace("'", "\\'")
    query = f"attributes.run_name = '{escaped}'"
    found = [r for r in search_runs(client, experiments, query) if not is_comparison(r)]
    if not found:
        raise RaysimError(
            f"no MLflow run id or run name {name!r} in {uri}; `raysim runs` lists the store's runs "
            f"(another store: {WHICH_STORE})"
        )
    if len(found) > 1:
        candidates = "; ".join(f"{r.info.run_id} ({r.info.status}, started {started(r)})" for r in found)
        raise RaysimError(f"{len(found)} runs are named {name!r}: {candidates}; give the run id of one")
    return found[0]


def started(run: Any) -> str:
    """The run's start, local time to the minute."""
    return datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")


def parse_where(where: Sequence[str]) -> dict[str, Any]:
    """``["seed=1", "variant=fedprox"]`` -> ``{"seed": 1, "variant": "fedprox"}``, values as YAML.

    Raises:
        RaysimError: an item that is no ``key=value``.
    """
    conditions: dict[str, Any] = {}
    for item in where:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RaysimError(f"--where {item!r}: expected key=value, e.g. --where algorithm.local.lr=0.1")
        conditions[key] = _as_value(value)
    return conditions


def matches(run: Any, conditions: dict[str, Any]) -> bool:
    """Whether each condition's key is a param (the flattened config) or tag of the run with that
    value; ``0.10`` matches ``0.1`` (compared as YAML values)."""
    found = {**run.data.tags, **run.data.params}
    return all(key in found and _as_value(found[key]) == value for key, value in conditions.items())


def _as_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def is_comparison(run: Any) -> bool:
    return run.data.tags.get(KIND_TAG) == COMPARISON


def unique_names(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The records with a run id suffix on names that several share (reruns of one job), so that
    rows and legend entries tell them apart."""
    names = [r.name for r in records]
    return [
        replace(r, name=f"{r.name} ({str(r.run_id)[:8]})") if names.count(r.name) > 1 else r for r in records
    ]
