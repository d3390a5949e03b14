"""The exceptions MLflow's client raises when its store is away or full, built as MLflow builds
them, for tests that inject them (tests/unit/tracking/test_outbox.py, tests/integration/tracking/);
and addresses of tracking servers that are away: one that refuses, one that hangs."""

import contextlib
import errno
import socket
import sqlite3
from collections.abc import Iterator

import requests
import sqlalchemy.exc
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE


def server_gone() -> MlflowException:
    """A tracking server that refuses connections (mlflow.utils.rest_utils.http_request: an
    MlflowException raised while handling requests' ConnectionError)."""
    try:
        try:
            raise requests.exceptions.ConnectionError("[Errno 111] Connection refused")
        except requests.exceptions.ConnectionError as exc:
            raise MlflowException(f"API request to http://127.0.0.1:5000 failed with exception {exc}")  # noqa: B904
    except MlflowException as raised:
        return raised


def database_full() -> MlflowException:
    """A SQLite store on a full disk (mlflow.store.db.utils.make_managed_session: SQLAlchemy's
    OperationalError from sqlite3's, as TEMPORARILY_UNAVAILABLE)."""
    full = sqlite3.OperationalError("database or disk is full")
    try:
        try:
            raise sqlalchemy.exc.OperationalError("INSERT INTO metrics", {}, full) from full
        except sqlalchemy.exc.OperationalError as exc:
            raise MlflowException(message=exc, error_code=TEMPORARILY_UNAVAILABLE) from exc
    except MlflowException as raised:
        return raised


def artifacts_full() -> OSError:
    """A local artifact store on a full disk (shutil.copy in LocalArtifactRepository.log_artifact)."""
    return OSError(errno.ENOSPC, "No space left on device")


def refused_uri() -> str:
    """A tracking server that is gone: nothing listens on its port (the OS's free port, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def hung_uri() -> Iterator[str]:
    """A tracking server that hangs (a stopped process): the kernel accepts connections to its port,
    and nothing ever answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
