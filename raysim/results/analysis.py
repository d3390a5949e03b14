"""A finished run opened for analysis: its job, its checkpoints and the engine's evaluation side,
without training and without a new MLflow run (``raysim analyze``).

The run is found by its MLflow id: its job is the ``config/job.yaml`` artifact, its checkpoints
lie in the folder its ``run_dir`` tag names (``checkpoints/round_XXXXX.pt`` every
``engine.checkpoint_every`` rounds, ``final.pt`` always; ``final.pt`` is also an artifact when
``tracking.log_checkpoint``). Results are logged back into the same run, at the step of its last
round.

Usage:
    with FinishedRun.open(run_id, tracking_uri=None, backend="serial") as run:
        models = {ref: run.model(ref) for ref in ("init", "round:2", "final")}  # checked first
        with run.services() as services:  # the workers run only inside the block
            rows = services.map_clients(MapRequest(EVALUATE, list(models.values()), run.evaluation_clients()))
        run.log({"analysis/x": 1.0}); run.log_artifact(png, "analysis")
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from raysim import params as P
from raysim.checkpoint import check_compatible, read_state, round_of_name
from raysim.config import JobConfig, TrackingConfig, deep_merge
from raysim.config.renames import upgrade_saved_job
from raysim.engine.build import JobParts, engine_of, open_parts, start_workers
from raysim.engine.preflight import check_existing_tracking_store
from raysim.engine.resumed_state import refuse_nonfinite_checkpoint
from raysim.errors import CheckpointError, RaysimError
from raysim.plugin_defaults import fresh_state
from raysim.results.run_store import RUN_ID, WHICH_STORE, run_named
from raysim.sampling import sample_eval_clients
from raysim.services import Services
from raysim.tracking.tracker import RUN_DIR_TAG, MlflowTracker
from raysim.tracking.tracking_store import download_artifact
from raysim.tracking.tracking_store import tracking_uri as default_tracking_uri
from raysim.types import Metrics, NumpyParams

JOB_ARTIFACT = "config/job.yaml"
FINAL = "final.pt"


@dataclass
class FinishedRun:
    """An MLflow run of ``raysim run`` with its job rebuilt: models by reference, workers on demand."""

    run_id: str
    tracker: MlflowTracker  # attached to the run: what the analysis logs lands there
    parts: JobParts
    run_dir: Path | None  # None: the run has no ``run_dir`` tag (an older raysim logged it)
    _scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="raysim-analyze-")))

    @classmethod
    def open(
        cls,
        run_id: str,
        tracking_uri: str | None = None,
        *,
        backend: Literal["ray", "serial"] | None = None,
        num_workers: int | None = None,
    ) -> FinishedRun:
        """Finds the run and rebuilds its job's data, plugins and initial model (no processes).

        Args:
            run_id: the MLflow run id ``raysim run`` printed, or the run's name.
            tracking_uri: the run's store; None: MLFLOW_TRACKING_URI, else ./mlflow.db.
            backend, num_workers: override the job's ``resources`` for the evaluation.

        Raises:
            RaysimError: no such store or run, or the run has no raysim job.
        """
        tracker, run = attach_run(run_id, tracking_uri)
        uri, run_id = tracker.uri, run.info.run_id
        job = JobConfig.from_dict(deep_merge(read_job(run_id, uri), resources_override(backend, num_workers)))
        run_dir = run.data.tags.get(RUN_DIR_TAG)
        return cls(run_id, tracker, open_parts(job), Path(run_dir) if run_dir else None)

    @property
    def job(self) -> JobConfig:
        return self.parts.job

    # --- models by reference --------------------------------------------------------------

    def model(self, ref: str) -> NumpyParams:
        """The parameters a reference names: ``final``, ``round:N``, ``init`` or a checkpoint file.

        Raises:
            CheckpointError: no such checkpoint (the message lists the rounds the run has), or a
                file that is not a checkpoint of this job's model.
        """
        if ref == "init":  # the seeded model, as the algorithm starts from it
            return P.to_numpy(fresh_state(self.parts.algorithm, self.parts.params, self.parts.info).params)
        return self._load(self.checkpoint_path(ref))

    def checkpoint_path(self, ref: str) -> Path:
        """The checkpoint file of ``final``, ``round:N`` or a path (``init`` has none)."""
        if ref == FINAL.removesuffix(".pt"):
            return self._final()
        if ref.startswith("round:"):
            number = ref.removeprefix("round:")
            if not number.isdigit():
                raise CheckpointError(f"model reference {ref!r}: round:N takes a round number, e.g. round:3")
            return self._round(int(number))
        path = Path(ref).expanduser()
        if path.is_file():
            return path
        raise CheckpointError(
            f"model reference {ref!r} is no checkpoint file; use final, init, round:N "
            f"({self.describe_rounds()}) or a path to a .pt checkpoint"
        )

    def rounds(self) -> dict[int, Path]:
        """Round -> checkpoint file, of every ``round_XXXXX.pt`` in the run's folder."""
        folder = self.run_dir / "checkpoints" if self.run_dir is not None else None
        if folder is None or not folder.is_dir():
            return {}
        found = ((round_of_name(p.name), p) for p in folder.iterdir())
        return {round_num: path for round_num, path in found if round_num is not None}

    def describe_rounds(self) -> str:
        """The checkpointed rounds in words, for error messages."""
        if self.run_dir is None:
            return f"run {self.run_id} has no {RUN_DIR_TAG!r} tag: only final, if logged, and files"
        rounds = sorted(self.rounds())
        return f"rounds with a checkpoint: {rounds}" if rounds else f"no round checkpoints in {self.run_dir}"

    def _round(self, round_num: int) -> Path:
        rounds = self.rounds()
        if round_num in rounds:
            return rounds[round_num]
        with contextlib.suppress(CheckpointError):  # the last round is in final.pt too
            final = self._final()
            if self.round_of(final) == round_num:
                return final
        fix = (
            "run the job with engine.checkpoint_every=1 to keep every round"
            if self.run_dir is not None
            else "name the checkpoint file by its path (an older raysim did not tag the run's folder)"
        )
        raise CheckpointError(
            f"run {self.run_id} has no checkpoint of round {round_num} ({self.describe_rounds()}); {fix}"
        )

    def _final(self) -> Path:
        return final_checkpoint(self.tracker.uri, self.run_id, self.run_dir, self._scratch)

    def round_of(self, path: Path) -> int:
        """The last completed round a checkpoint file holds."""
        return read_state(path)[1]

    def _load(self, path: Path) -> NumpyParams:
        state, _ = read_state(path)
        check_compatible(state, self.parts.params, str(path))
        refuse_nonfinite_checkpoint(state, str(path), "analyze")  # as eval and --resume refuse it
        return P.to_numpy(state.params)

    # --- evaluation and logging -----------------------------------------------------------

    def evaluation_clients(self, count: int | None = None) -> np.ndarray | None:
        """Where to evaluate (``clients`` of ``map_clients``): ``count`` of the run's evaluated
        clients (drawn from its seed); else None, the central test set; else, for a dataset without
        one, all of its evaluated clients (their pooled loss is the run's ``eval/clients/loss``)."""
        pool = self.parts.plan.clients
        if count is not None and count > len(pool):  # else silently fewer than asked for
            raise RaysimError(f"--clients {count}: the run evaluates {len(pool)} clients, at most")
        if count is not None:
            return pool[sample_eval_clients(len(pool), count, self.job.seed)]
        return None if self.parts.store.meta["has_central_test"] else pool

    @contextlib.contextmanager
    def services(self) -> Iterator[Services[object]]:
        """The engine, for its verbs (``map_clients`` over all workers), while the workers run."""
        state_dir = self._scratch / "client_state"  # evaluation never reads or writes client state
        backend = start_workers(self.parts, state_dir)
        try:
            yield engine_of(self.parts, backend, self.tracker, self._scratch, state_dir)
        finally:
            backend.shutdown()

    @property
    def last_round(self) -> int:
        """The run's last round (``engine.num_rounds - 1``): the step its final evaluation is
        logged at, and the analysis's metrics."""
        return self.job.engine.num_rounds - 1

    def log(self, metrics: Metrics, step: int | None = None) -> None:
        """Metrics into the analyzed run, by default at the step of its last round
        (``last_round``), beside its final evaluation. Analysing again logs another value at
        that step; MLflow shows the latest."""
        self.tracker.log_metrics(metrics, self.last_round if step is None else step)

    def log_artifact(self, path: Path, artifact_dir: str | None = None) -> None:
        self.tracker.log_artifact(path, artifact_dir)

    def output_dir(self) -> Path:
        """Where the analysis writes its files: ``<run_dir>/analysis``, else a scratch folder."""
        folder = (self.run_dir if self.run_dir and self.run_dir.is_dir() else self._scratch) / "analysis"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def close(self) -> None:
        """Removes the scratch folder (downloaded checkpoints; files written when the run's folder
        is gone). The workers are already stopped: ``services`` stops them."""
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> FinishedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach_run(run_id: str, tracking_uri: str | None) -> tuple[MlflowTracker, Any]:
    """A tracker attached to an existing run (by id, or by a name only it has), and the MLflow
    run; ``tracking_uri`` None: MLFLOW_TRACKING_URI, else ./mlflow.db.

    Raises:
        RaysimError: no such store (a URI raysim cannot use, a SQLite file that is missing or no
            MLflow store, a server that does not answer) or no such run in it, or a name several
            runs share.
    """
    uri = tracking_uri or default_tracking_uri(TrackingConfig())
    check_existing_tracking_store(uri, f"point at the store the run was logged to: {WHICH_STORE}")
    tracker = MlflowTracker.attach(run_id, uri)
    if not RUN_ID.fullmatch(run_id):  # a run name, which must name one run
        tracker.run_id = run_named(tracker.client, run_id, uri).info.run_id
    return tracker, find_run(tracker, str(tracker.run_id), uri)


def find_run(tracker: MlflowTracker, run_id: str, uri: str) -> Any:
    """The MLflow run, or one line saying where it was looked for."""
    from mlflow.exceptions import MlflowException

    try:
        return tracker.client.get_run(run_id)
    except MlflowException:
        raise RaysimError(
            f"no MLflow run {run_id!r} in {uri}; copy the id from `raysim run`'s output or the "
            f"MLflow UI (raysim ui), or point at another store: {WHICH_STORE}"
        ) from None


def final_checkpoint(uri: str, run_id: str, run_dir: Path | None, scratch: Path) -> Path:
    """A run's ``final.pt``: in its run folder, else its artifact downloaded into ``scratch``.

    Raises:
        CheckpointError: neither is there (the run did not finish, or logged no checkpoint).
    """
    local = run_dir / "checkpoints" / FINAL if run_dir is not None else None
    if local is not None and local.is_file():
        return local
    downloaded = scratch / FINAL
    if downloaded.is_file():
        return downloaded
    try:  # the run's folder is gone or elsewhere: the artifact (tracking.log_checkpoint)
        return download_artifact(uri, run_id, FINAL, scratch)
    except Exception:  # MLflow raises its own, or OSError, for an artifact that is not there
        where = f"{local} is missing" if local is not None else f"the run has no {RUN_DIR_TAG!r} tag"
        raise CheckpointError(
            f"run {run_id} has no final checkpoint: {where} and no {FINAL} artifact was "
            f"logged; give a checkpoint file's path instead (did the run finish?)"
        ) from None


def read_job(run_id: str, uri: str) -> dict[str, Any]:
    """The run's resolved job (the ``config/job.yaml`` artifact ``raysim run`` logs)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = download_artifact(uri, run_id, JOB_ARTIFACT, folder)
        except Exception:  # MLflow's own exception, or OSError, when the artifact is absent
            raise RaysimError(
                f"run {run_id} has no {JOB_ARTIFACT} artifact: it was not logged by `raysim run`"
            ) from None
        raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict):
        raise RaysimError(f"run {run_id}: {JOB_ARTIFACT} holds no job mapping")
    return upgrade_saved_job(raw)  # a run logged before options were renamed reads as today's


def resources_override(backend: Literal["ray", "serial"] | None, num_workers: int | None) -> dict[str, Any]:
    """The ``resources`` section changes an analysis asks for (the run's own otherwise)."""
    resources: dict[str, Any] = {}
    if backend is not None:
        resources["backend"] = backend
    if num_workers is not None:
        resources["num_workers"] = num_workers
    return {"resources": resources} if resources else {}
