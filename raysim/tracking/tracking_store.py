"""Where an MLflow store is and how its files are reached: the job's tracking URI, a SQLite
store's database and its artifacts beside it (at locations relative to the database's folder, so
that the folder can be copied or moved), and the lock that keeps two processes from creating one
store's schema at once.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from raysim.config import TrackingConfig
from raysim.errors import ResourceError

_STORE_LOCK_TIMEOUT_S = 600
ARTIFACTS_DIR = "mlruns"  # a SQLite store's artifacts, beside its database
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database


def tracking_uri(config: TrackingConfig) -> str:
    """The job's URI, else MLFLOW_TRACKING_URI, else SQLite in the working directory."""
    return (
        config.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI (query options dropped), None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


def check_sqlite_file(database: Path, hint: str) -> None:
    """A SQLite store's path is free, an empty file, or a SQLite database: SQLite takes a file
    shorter than its header for an empty database, and MLflow would write its tables over it.

    Raises:
        ResourceError: a folder, or a file holding something else, is in the way.
    """
    if database.is_dir():
        raise ResourceError(f"the MLflow store {database} is a folder, not a SQLite database; {hint}")
    if database.is_file() and database.stat().st_size > 0:
        with database.open("rb") as file:
            if file.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise ResourceError(
                    f"the MLflow store {database} is a file but not a SQLite database; {hint}"
                )


def check_existing_store(database: Path, hint: str) -> None:
    """A reader's SQLite store holds MLflow's tables; it is opened read-only, so a missing, empty or
    foreign file is refused, never made into a store.

    Raises:
        ResourceError: naming the file and ``hint`` (what else the user may do).
    """
    if not database.is_file() or database.stat().st_size == 0:
        raise ResourceError(f"no MLflow store at {database}; {hint}")
    check_sqlite_file(database, hint)
    try:
        with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as exc:
        raise ResourceError(f"the MLflow store {database} cannot be read ({exc}); {hint}") from None
    if not {"experiments", "runs"} <= tables:
        raise ResourceError(
            f"{database} is a SQLite database but no MLflow store (no experiments or runs table); {hint}"
        )


def is_server(uri: str) -> bool:
    """A tracking server (runs and artifacts over HTTP), not a database this process opens."""
    return uri.startswith(("http://", "https://"))


def absolute_uri(uri: str, cwd: Path | None = None) -> str:
    """The URI with a relative SQLite path made absolute against ``cwd`` (default: the working
    directory), so that a process started elsewhere (an MLflow server run in the store's folder, a
    Ray job) opens the same database; other URIs as they are."""
    if not uri.startswith("sqlite:///"):
        return uri
    path, _, query = uri.removeprefix("sqlite:///").partition("?")
    database = ((cwd or Path.cwd()) / Path(path).expanduser()).resolve()
    return f"sqlite:///{database}" + (f"?{query}" if query else "")


def artifact_root(uri: str) -> str | None:
    """For a SQLite store, artifacts go beside the database (not into the working directory)."""
    database = sqlite_path(uri)
    return (database.parent / ARTIFACTS_DIR).as_uri() if database is not None else None


def resolve_artifact_uri(uri: str, artifact_uri: str) -> str:
    """A run's artifact location as a reader here can open it: a relative one (what raysim
    writes into a SQLite store) lies in the database's folder."""
    database = sqlite_path(uri)
    if database is None or "://" in artifact_uri or Path(artifact_uri).is_absolute():
        return artifact_uri
    return str(database.parent / artifact_uri)


def artifact_repository(uri: str, run_id: str) -> Any:
    """The MLflow artifact repository of a run in the store at ``uri``, wherever the store's
    folder was copied to: ``.download_artifacts(path, dst)``, ``.list_artifacts()``."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    return get_artifact_repository(resolve_artifact_uri(uri, run.info.artifact_uri), tracking_uri=uri)


def download_artifact(uri: str, run_id: str, artifact_path: str, dst: str | Path) -> Path:
    """Downloads one artifact of a run into ``dst`` (made if missing); returns the local path."""
    Path(dst).mkdir(parents=True, exist_ok=True)
    return Path(artifact_repository(uri, run_id).download_artifacts(artifact_path, str(dst)))


def make_relative(database: Path, experiment_id: str) -> None:
    """Stores an experiment's artifact location relative to the database's folder.

    MLflow has no API for it: ``create_experiment`` turns every local location absolute, which
    breaks a store copied or moved to another folder. Its runs then get relative locations too
    (MLflow appends the run id to the experiment's).
    """
    with contextlib.closing(sqlite3.connect(database)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
            (f"{ARTIFACTS_DIR}/{experiment_id}", int(experiment_id)),
        )


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Holds an inter-process lock on a SQLite store (no-op for other stores).

    MLflow creates the SQLite schema and the default experiment when a client first opens the
    database, without any locking: two runs started at once in a new directory collide on
    ``CREATE TABLE`` / ``ALTER TABLE`` and one of them crashes. The lock file sits beside the
    database; the OS releases it when its holder dies.

    Raises:
        ResourceError: another process held the lock for longer than 10 minutes.
    """
    database = sqlite_path(uri)
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(database.with_name(database.name + ".lock"))
    try:
        lock.acquire(timeout=_STORE_LOCK_TIMEOUT_S)
    except Timeout:
        raise ResourceError(
            f"the MLflow store {database} stayed locked ({lock.lock_file}) for "
            f"{_STORE_LOCK_TIMEOUT_S} s by another process; is one stuck?"
        ) from None
    try:
        yield
    finally:
        lock.release()
