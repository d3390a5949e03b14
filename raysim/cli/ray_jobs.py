"""Ray Jobs from the outside: reach a cluster's job API, authenticate, upload, follow a job.

Everything goes through Ray's documented ``JobSubmissionClient`` (``ray.job_submission``), so
``raysim submit`` needs nothing on the cluster beyond a Ray with raysim installed.

Ray 2.60 token authentication: ``ray start --head`` turns it on whenever a token exists, but
Ray's client sends the token only under ``RAY_AUTH_MODE=token``. ``auth_token`` finds the token
where Ray does and ``connect`` sends it as Ray would (an ``Authorization: Bearer`` header), so a
token-enabled head needs no extra variable.

Usage:
    token = auth_token(os.environ, Path.home())
    client = connect("http://127.0.0.1:8265", token)
    job_id = submit(client, token, "python -m raysim run job.yaml", runtime_env)
    status, message = follow(client, job_id)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from raysim.errors import RaysimError
from raysim.stop_request import raise_stop_request

if TYPE_CHECKING:
    from ray.job_submission import JobStatus, JobSubmissionClient

log = logging.getLogger("raysim")

CONNECT_TIMEOUT_S = 5.0
# The loggers of Ray's job client and packaging; the first two set their own level (INFO).
RAY_CLIENT_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk", "ray")
IGNORE_FILES = (".gitignore", ".rayignore")
# A working_dir travels as one gRPC message: Ray refuses packages of its max size (512 MiB).
UPLOAD_LIMIT = int(os.environ.get("RAY_max_grpc_message_size", 512 * 1024**2))


def probe(url: str, token: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Asks the job API for its version, giving up after ``timeout_s`` (Ray's client has no
    timeout: a silent host holds it for minutes).

    Raises:
        RaysimError: nothing answers, something that is no Ray job API answers, or the cluster
            refuses the token (``auth_error`` says what to do).
    """
    import requests

    try:
        reply = requests.get(f"{url}/api/version", headers=_headers(token), timeout=timeout_s)
    except requests.RequestException as exc:
        reason = "no answer" if isinstance(exc, requests.Timeout) else "cannot connect"
        raise RaysimError(
            f"no Ray cluster answers at {url} ({reason} within {timeout_s:.0f} s): check the address "
            "and the dashboard's port (8265 unless `ray start --dashboard-port` chose another; not "
            "the GCS port 6379), and that the head was started with a `--dashboard-host` this "
            "machine reaches"
        ) from None
    if reply.status_code in (401, 403):
        raise RaysimError(auth_error(url, token, os.environ))
    if not reply.ok or "ray_version" not in reply.text:
        raise RaysimError(f"{url} answers (HTTP {reply.status_code}) but is no Ray dashboard's job API")


def auth_token(environ: Mapping[str, str], home: Path) -> str | None:
    """The cluster's token where Ray's client looks, in Ray's order: RAY_AUTH_TOKEN, the file
    RAY_AUTH_TOKEN_PATH names, ``~/.ray/auth_token``. None under RAY_AUTH_MODE=disabled or when
    there is none.

    Raises:
        RaysimError: RAY_AUTH_TOKEN_PATH names a missing or empty file.
    """
    if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return environ["RAY_AUTH_TOKEN"].strip()
    named = environ.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named).expanduser() if named else home / ".ray" / "auth_token"
    token = path.read_text().strip() if path.is_file() else ""
    if named and not token:
        raise RaysimError(f"RAY_AUTH_TOKEN_PATH={named} names no file holding a Ray token")
    return token or None


def auth_error(address: str, token: str | None, environ: Mapping[str, str]) -> str:
    """What to do when the cluster refused us: the token is missing or not the cluster's."""
    if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        found = "RAY_AUTH_MODE=disabled is set here, so no token was sent"
    elif token is None:
        found = "no token was found here (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"
    elif environ.get("RAY_AUTH_TOKEN", "").strip():
        found = "it refused the token of RAY_AUTH_TOKEN"
    else:
        found = f"it refused the token in {environ.get('RAY_AUTH_TOKEN_PATH') or '~/.ray/auth_token'}"
    return (
        f"the Ray cluster at {address} requires token authentication (Ray 2.60) and {found}: copy "
        "the head's token (`ray get-auth-token` on the head prints it) to ~/.ray/auth_token here, "
        "or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH; a cluster started with RAY_AUTH_MODE=disabled "
        "takes no token"
    )


def connect(address: str, token: str | None) -> JobSubmissionClient:
    """A job client of the cluster at ``address`` (``http://HOST:PORT``), sending ``token``.

    Raises:
        RaysimError: nothing (or no job API) answers there within seconds, or the cluster refuses
            the token.
    """
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    # Ray's client logs each upload step at INFO and warns that it skips .git and venvs (which
    # raysim excludes anyway): raysim reports what matters; Ray's errors still show.
    for name in RAY_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    probe(address, token)
    try:
        return JobSubmissionClient(address, headers=_headers(token))
    except AuthenticationError:
        raise RaysimError(auth_error(address, token, os.environ)) from None


def _headers(token: str | None) -> dict[str, str]:
    """The header Ray's own client sends under RAY_AUTH_MODE=token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def submit(
    client: JobSubmissionClient,
    token: str | None,
    entrypoint: str,
    runtime_env: dict[str, Any],
    submission_id: str | None = None,
) -> str:
    """Uploads the working directory (once per content) and starts the job (as ``submission_id``,
    else one Ray picks): its submission id."""
    from ray.exceptions import AuthenticationError

    try:
        return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id)
    except AuthenticationError:  # should the job API guard uploads and submissions only
        raise RaysimError(auth_error(client.get_address(), token, os.environ)) from None


def follow(client: JobSubmissionClient, job_id: str, out: IO[str] | None = None) -> tuple[str, str]:
    """Streams the job's logs to ``out`` (stdout) until it ends: its final status and Ray's message.

    A stream that breaks early (a dashboard restart) is not the job's end: its status is polled.
    Ctrl-C stops following (KeyboardInterrupt) wherever it lands, also where the log client
    swallows the cancellation it causes or a class being built wraps it.
    """
    interrupted = threading.Event()
    try:
        asyncio.run(_stream_logs(client, job_id, out or sys.stdout, interrupted))
    except RuntimeError as exc:
        raise_stop_request(exc)
        if not interrupted.is_set():
            log.warning("the log stream of %s broke (%s); waiting for the job to end", job_id, exc)
    if interrupted.is_set():
        raise KeyboardInterrupt
    status = _wait_until_done(client, job_id)
    return status.value, client.get_job_info(job_id).message or ""


async def _stream_logs(
    client: JobSubmissionClient, job_id: str, out: IO[str], interrupted: threading.Event
) -> None:
    task, loop = asyncio.current_task(), asyncio.get_running_loop()

    def on_ctrl_c() -> None:  # noted first: the log client may swallow the cancellation
        interrupted.set()
        if task is not None:
            task.cancel()

    if threading.current_thread() is threading.main_thread():
        loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    try:
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()
    except asyncio.CancelledError:
        if not interrupted.is_set():
            raise
    finally:
        if threading.current_thread() is threading.main_thread():
            loop.remove_signal_handler(signal.SIGINT)


def _wait_until_done(client: JobSubmissionClient, job_id: str, poll_s: float = 1.0) -> JobStatus:
    while not (status := client.get_job_status(job_id)).is_terminal():
        time.sleep(poll_s)
    return status


def upload_sizes(root: Path, excludes: Sequence[str]) -> dict[str, int]:
    """Bytes Ray would pack of ``root`` as a working_dir, per top-level entry, before compression:
    ``excludes`` and each .gitignore / .rayignore applied to its own folder and below, as Ray does
    (a .gitignore is skipped under RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1, as in Ray)."""
    from ray._private.thirdparty.pathspec import PathSpec  # the matcher Ray's packaging uses

    def matcher(base: Path, patterns: Sequence[str]) -> Callable[[Path], bool]:
        spec = PathSpec.from_lines("gitwildmatch", patterns)
        return lambda path: spec.match_file(str(path.relative_to(base)))

    skip_gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") == "1"
    sizes: dict[str, int] = {}

    def travel(path: Path, rules: list[Callable[[Path], bool]], top: str) -> None:
        for name in IGNORE_FILES:
            if (path / name).is_file() and not (skip_gitignore and name == ".gitignore"):
                rules = [*rules, matcher(path, (path / name).read_text().splitlines())]
        if any(rule(path) for rule in rules):
            return
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                travel(child, rules, top or child.name)
        elif path.is_file():
            sizes[top] = sizes.get(top, 0) + path.stat().st_size

    travel(root, [matcher(root, excludes)], "")
    return sizes
