"""Preflight: the tracking store and the Ray cluster a job names answer, checked in seconds before
any data is prepared, worker started or MLflow run opened.

Without it (measured on the development machines): an MLflow server that refuses connections cost
MLflow's 7 retries with exponential back-off, 256 s; one that accepts and never answers, 7 x 120 s
timeouts, 1,213 s; each ended in a traceback. A Ray address where no GCS answers hung ``ray.init``
for good (stopped after 617 s). With it, each is a ResourceError naming the address in 2-8 s.

Usage:
    preflight(job)  # raises ResourceError naming the address and what to do
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from raysim.config import JobConfig
from raysim.config.sections import tracking_uri_problem
from raysim.errors import ResourceError
from raysim.tracking.tracking_store import (
    check_existing_store,
    check_sqlite_file,
    is_server,
    sqlite_path,
    tracking_uri,
)

PROBE_TIMEOUT_S = 5.0
# Database servers MLflow can use as its store, by URI scheme (``postgresql+psycopg2`` -> ``postgresql``).
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
RAY_CLIENT_PORT = 10001  # ``ray://host`` without a port
GRPC_SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING} in protobuf's wire format
STORE_HINT = "set tracking.tracking_uri (or MLFLOW_TRACKING_URI), or run with tracking.enabled=false"


def preflight(job: JobConfig, *, tracking: bool = True) -> None:
    """Checks that the job's tracking store (when ``tracking``) and Ray cluster answer.

    Raises:
        ResourceError: naming the unreachable store or address and the fix.
    """
    if tracking and job.tracking.enabled:
        check_tracking_store(tracking_uri(job.tracking))
    if job.resources.backend == "ray":
        from raysim.runtime.ray_session import cluster_address, configured_address

        address = cluster_address(job.resources)  # None: this process starts its own Ray
        if address is not None:
            configured = configured_address(job.resources)
            check_ray_address(
                address, f"{address} (found for {configured!r})" if configured == "auto" else ""
            )


def check_output_dir(folder: Path, *inside: str) -> None:
    """The run's files can be made under ``folder`` (``--output-dir``), in each of its subfolders
    ``inside`` (``runs``: where a run folder goes): the nearest part of each that exists is a folder
    in which this process can make a folder. It makes one there and removes it at once: permission
    bits alone say yes to root, and to pseudo-filesystems (``/proc``) that refuse.

    Raises:
        ResourceError: naming the file or unwritable folder in the way.
    """
    root = folder.absolute()
    for target in [root / name for name in inside] or [root]:
        existing = next(p for p in (target, *target.parents) if p.exists())
        if not existing.is_dir():
            if existing == root:
                where = "is a file; pass a folder"
            elif existing in root.parents:
                where = f"lies under {existing}, which is a file; pass a folder"
            else:
                where = (
                    f"holds a file {existing} where raysim makes a folder; move it, or pass another folder"
                )
            raise ResourceError(f"the output folder {folder} (--output-dir) {where}")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".raysim-probe-", dir=existing))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.ENOENT:  # /proc's answer to a new entry in a folder that exists
                reason = f"it takes no new entries ({reason})"
            raise ResourceError(
                f"the output folder {folder} (--output-dir) cannot be written (cannot make a "
                f"folder in {existing}: {reason}); pass a folder you can write"
            ) from None


def check_tracking_store(uri: str, hint: str = STORE_HINT) -> None:
    """The URI is one raysim can use (``tracking_uri_problem``); an MLflow server answers its REST
    API; a SQLite store's folder can be written and its file, if any, is a SQLite database; a
    database server accepts connections. Other stores are left to MLflow. ``hint`` ends the error:
    what else the user may do."""
    problem = tracking_uri_problem(uri)
    if problem:
        raise ResourceError(problem)
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+")[0]
    database = sqlite_path(uri)
    if is_server(uri):
        check_tracking_server(uri, hint)
    elif database is not None:
        check_writable_folder(database, uri)
    elif scheme in DATABASE_PORTS and parts.hostname:
        host, port = parts.hostname, parts.port or DATABASE_PORTS[scheme]
        address = f"{host}:{port}"
        try:
            socket.create_connection((host, port), PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise ResourceError(
                f"the MLflow store {uri}: its database server {address} {unreachable(exc, address)}; "
                f"start it, or {hint}"
            ) from None


def check_existing_tracking_store(uri: str, hint: str) -> None:
    """``check_tracking_store`` for a command that reads or adds to runs already logged: a SQLite
    store must exist and hold MLflow's tables (MLflow would make a new store of any other file).

    Raises:
        ResourceError: naming the store and ``hint``.
    """
    database = sqlite_path(uri)
    if database is not None:
        check_existing_store(database, hint)
    else:
        check_tracking_store(uri, hint)


def check_tracking_server(uri: str, hint: str = STORE_HINT) -> None:
    """The server answers within ``PROBE_TIMEOUT_S`` (GET /health), then its REST API does."""
    parts = urlsplit(uri)
    address = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    unverified = ssl._create_unverified_context()  # reachability only: MLflow checks certificates
    try:
        urllib.request.urlopen(
            uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S, context=unverified
        ).close()
    except urllib.error.HTTPError:
        pass  # it answers HTTP: whether it is MLflow, the API call below says
    except (urllib.error.URLError, OSError) as exc:
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ResourceError(
            f"the MLflow tracking server {uri} {unreachable(cause, address)}; start it (e.g. "
            f"raysim server --host 127.0.0.1 --port {parts.port or 5000}), or {hint}"
        ) from None
    check_tracking_api(uri, hint)


def check_tracking_api(uri: str, hint: str = STORE_HINT) -> None:
    """One cheap REST call with MLflow's own client (its credentials, TLS settings and proxies),
    without MLflow's minutes of retries."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    timeout = str(max(1, round(PROBE_TIMEOUT_S)))  # MLflow reads whole seconds
    with environment(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=timeout):
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except MlflowException as exc:
            raise ResourceError(
                f"the tracking server {uri} answers, but not as an MLflow server should: "
                f"{shorten(exc.message)}; check the address (and MLFLOW_TRACKING_USERNAME / "
                f"MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN if it needs them), or {hint}"
            ) from None


def check_writable_folder(database: Path, uri: str) -> None:
    """A SQLite store (and the artifacts beside it) needs a folder this process can write."""
    folder = database.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResourceError(
            f"the MLflow store {uri}: its folder {folder} cannot be created ({exc.strerror}); {STORE_HINT}"
        ) from None
    unwritable = [p for p in (folder, database) if p.exists() and not os.access(p, os.R_OK | os.W_OK)]
    if unwritable:
        raise ResourceError(f"the MLflow store {uri}: {unwritable[0]} is not writable; {STORE_HINT}")
    check_sqlite_file(database, STORE_HINT)


def check_ray_address(address: str, named: str = "") -> None:
    """Ray's GCS answers its gRPC health check at ``address`` (for ``ray://``, a Ray Client server
    accepts the connection).

    A TCP connect alone is not enough: a proxy or another service on the port accepts it, and
    ``ray.init`` then waits for good.

    Args:
        named: how the message names the cluster (default: ``address``).

    Raises:
        ResourceError: nothing answers there, or something that is not a Ray GCS.
    """
    host, port = host_and_port(address)
    named = named or address
    hint = (
        "start the cluster (ray start --head), or fix resources.address / RAY_ADDRESS (host:port of "
        "the head's GCS, default port 6379; ray://host:10001 for Ray Client); unset both to run on a "
        "Ray of this machine"
    )
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ResourceError(
            f"the Ray cluster at {named} {unreachable(exc, f'{host}:{port}')}; {hint}"
        ) from None
    if address.startswith("ray://") or os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # the Ray Client server has no health service; TLS needs the cluster's certificates
    problem = gcs_health(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if problem:
        raise ResourceError(f"the Ray cluster at {named} answers, but not as a Ray GCS ({problem}); {hint}")


def gcs_health(target: str) -> str | None:
    """The standard gRPC health check (grpc.health.v1), which Ray's GCS serves: None when it
    reports SERVING, else what went wrong."""
    import grpc

    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda request: request,
            response_deserializer=lambda response: response,
        )
        try:
            reply = check(b"", timeout=PROBE_TIMEOUT_S)  # an empty HealthCheckRequest: the whole server
        except grpc.RpcError as exc:
            return f"gRPC health check: {exc.code().name.lower()}, {shorten(str(exc.details()), 120)}"
    return None if reply == GRPC_SERVING else f"gRPC health check: reply {reply!r}, not SERVING"


def host_and_port(address: str) -> tuple[str, int]:
    """``host:port``, ``ray://host[:port]`` or ``[v6]:port`` as (host, port)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    default = RAY_CLIENT_PORT if parts.scheme == "ray" else None
    try:
        port = parts.port or default
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ResourceError(
            f"resources.address / RAY_ADDRESS {address!r} is no Ray address: give host:port "
            f"(e.g. 10.0.0.5:6379), ray://host:10001 or auto"
        )
    return parts.hostname, port


def unreachable(exc: BaseException | str, address: str) -> str:
    """Why a connection failed, in words."""
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"did not answer within {PROBE_TIMEOUT_S:g} s (a wrong address, a firewall, or it is down)"
    if isinstance(exc, ConnectionRefusedError):
        return f"refused the connection (nothing listens on {address})"
    if isinstance(exc, socket.gaierror):
        return f"cannot be found (unknown host in {address})"
    return f"cannot be reached ({exc})"


def shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Environment variables set for the block, restored afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
