"""The sweep's parent MLflow run: opened (or reopened by a rerun), watched by a sentinel that ends it
KILLED should its driver be killed outright, and ended by its driver.

A rerun reopens it. Its own driver's lock (``raysim.sweep.sweep_lock``) keeps a second driver of
the same output folder out; a run still RUNNING under another driver (one of another output
folder, or on another host) is refused, naming it. A run still RUNNING under a driver that no
longer runs (its sentinel died too: the machine rebooted) is ended KILLED first, with the cell
runs it left RUNNING, so no run claims to run that does not.

Usage:
    parent = SweepRun.open(sweep, job, hold.dead_driver, print)
    ...
    parent.end("FINISHED")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raysim.config import JobConfig
from raysim.config.cells import Sweep, sweep_params
from raysim.config.sweep import CELL_TAG, DRIVER_TAG, KIND_TAG, STOPPED_TAG, SWEEP_KIND, SWEEP_TAG
from raysim.errors import RaysimError
from raysim.runtime.sentinel import Sentinel
from raysim.tracking.driver_lock import this_driver
from raysim.tracking.provenance import source_tags
from raysim.tracking.tracker import MlflowTracker

PARAMS_PER_BATCH = 100  # the most MLflow takes in one log_batch


@dataclass
class SweepRun:
    """The sweep's parent MLflow run, held by this driver."""

    tracker: MlflowTracker
    run_id: str
    sweep_id: str
    sentinel: Sentinel | None = None

    @classmethod
    def open(
        cls, sweep: Sweep, job: JobConfig, dead_driver: str = "", say: Callable[[str], None] = print
    ) -> SweepRun:
        """The sweep's run: the one an earlier try of the same sweep started (RUNNING again), else new.
        ``dead_driver``: the driver whose stale lock this one took over, "" if none.

        Raises:
            RaysimError: the run is RUNNING under another driver that may still run it.
        """
        tracker = MlflowTracker(job.tracking)
        experiment = tracker.experiment_id()
        earlier = tracker.client.search_runs(
            [experiment], f"tags.`{SWEEP_TAG}` = '{sweep.id}' and tags.`{KIND_TAG}` = '{SWEEP_KIND}'"
        )
        if earlier:
            parent = cls(tracker, earlier[0].info.run_id, sweep.id)
            if earlier[0].info.status == "RUNNING":
                parent.end_left_running(earlier[0].data.tags.get(DRIVER_TAG, ""), dead_driver, say)
            tracker.client.update_run(parent.run_id, status="RUNNING")
            tracker.client.set_tag(parent.run_id, DRIVER_TAG, this_driver())
        else:
            tags = {KIND_TAG: SWEEP_KIND, SWEEP_TAG: sweep.id, DRIVER_TAG: this_driver(), "job": sweep.job}
            run = tracker.client.create_run(
                experiment, run_name=f"{sweep.job}/sweep", tags=tags | source_tags(job)
            )
            parent = cls(tracker, run.info.run_id, sweep.id)
            try:
                parent.log_params(sweep_params(sweep.spec))
            except BaseException:  # never left RUNNING by this driver's own failure
                tracker.client.set_terminated(parent.run_id, "FAILED")
                raise
        parent.sentinel = Sentinel.start("end-run", tracker.uri, parent.run_id)  # KILLED if this dies
        return parent

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value[:6000]) for key, value in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.tracker.client.log_batch(self.run_id, params=items[start : start + PARAMS_PER_BATCH])

    def end_left_running(self, driver: str, dead_driver: str, say: Callable[[str], None]) -> None:
        """Ends KILLED this run, found RUNNING, and the cell runs it left RUNNING, when the driver
        that left it no longer runs: the one whose stale lock this driver took over, or one
        before drivers were named. Refuses any other."""
        if driver == this_driver():  # opened earlier by this process, which runs: nothing was left
            return
        if driver and driver != dead_driver:
            uri, run = self.tracker.uri, self.run_id
            raise RaysimError(
                f"sweep {self.sweep_id}: its MLflow run {run} is RUNNING under {driver} (a driver with "
                f"another --output-dir, or on another host); let it finish, or if it no longer runs, "
                f"end the run with MlflowClient({uri!r}).set_terminated({run!r}, 'KILLED') and run "
                "the same command again"
            )
        cells = self.kill_running_cells()
        self.tracker.client.set_terminated(self.run_id, "KILLED")
        say(
            f"sweep {self.sweep_id}: its MLflow run {self.run_id} was left RUNNING by "
            f"{driver or 'a driver'}, which no longer runs: ended it KILLED, with {cells} cell run(s)"
        )

    def finished_cells(self) -> set[str]:
        """Cells of this sweep whose run FINISHED or was stopped by the stopping rule."""
        return {
            r.data.tags[CELL_TAG]
            for r in self._cell_runs()
            if CELL_TAG in r.data.tags and (r.info.status == "FINISHED" or STOPPED_TAG in r.data.tags)
        }

    def kill_running_cells(self) -> int:
        """Ends KILLED the cell runs still RUNNING once the sweep stopped (a SIGTERM reaches the
        driver only, and its cells' workers may be ended before their own clean-up ran); how many."""
        running = [r for r in self._cell_runs("RUNNING") if r.info.run_id != self.run_id]
        for cell_run in running:
            self.tracker.client.set_terminated(cell_run.info.run_id, "KILLED")
        return len(running)

    def end(self, status: str) -> None:
        """Ends the run with ``status``; its sentinel stands down."""
        self.tracker.client.set_terminated(self.run_id, status)
        if self.sentinel is not None:
            self.sentinel.stand_down()

    def _cell_runs(self, status: str | None = None) -> list[Any]:
        where = f" and attributes.status = '{status}'" if status is not None else ""
        return list(
            self.tracker.client.search_runs(
                [self.tracker.experiment_id()],
                f"tags.`{SWEEP_TAG}` = '{self.sweep_id}'{where}",
                max_results=50000,
            )
        )
