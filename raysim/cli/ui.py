"""``raysim ui`` (MLflow's UI on a run store) and ``raysim server`` (a tracking server for clusters).

Both run ``mlflow server`` tuned for a small machine: one uvicorn worker instead of four, and
without MLflow's GenAI job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``), which training
runs never use. On 2 shared cores that cut the time to the first answer from 12-30 s (15
processes, 2.4 GB) to 5-10 s (2 processes, 0.5 GB). The address is printed only once the server
answers, with a link to the newest experiment's runs as charts (MLflow 3 otherwise opens an
experiment on its GenAI page).

The server runs in its own process group. Ctrl-C, SIGTERM or SIGHUP to raysim stops that whole
group (SIGTERM, then SIGKILL after a grace period); on Linux the server also gets SIGTERM when
raysim dies without cleaning up (SIGKILL), so no MLflow server outlives the command that started it.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from raysim.cli.console import console
from raysim.cli.run_links import print_experiment_links
from raysim.errors import DataError, RaysimError, ResourceError

START_TIMEOUT_S = 180.0  # MLflow's cold start took ~50 s with 4 workers on 2 busy cores
STOP_GRACE_S = 5.0  # after SIGTERM, before SIGKILL
# MLflow's background runner for GenAI jobs (judges, evaluation): idle for training runs, costly to start
LEAN_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def add_ui_parser(sub: argparse._SubParsersAction) -> None:
    ui = sub.add_parser(
        "ui",
        help="open the MLflow UI on the run store (127.0.0.1)",
        description="Serves the run store with MLflow's UI on 127.0.0.1 and prints the address "
        "once it answers, with links to the newest experiment's runs. Ctrl-C stops it.",
    )
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--tracking-uri", help="default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    ui.add_argument("--dry-run", action="store_true", help="print the command only")
    ui.set_defaults(handler=cmd_ui)


def add_server_parser(sub: argparse._SubParsersAction) -> None:
    server = sub.add_parser(
        "server",
        help="an MLflow tracking server for a cluster: runs and artifacts over HTTP",
        description="Serves a run store and its artifacts over HTTP (mlflow server "
        "--serve-artifacts), so that drivers and workers on other machines log to it; prints "
        "the MLFLOW_TRACKING_URI clients should use. MLflow has no authentication: bind an "
        "address only your cluster reaches. Ctrl-C stops it.",
    )
    server.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on: this node's cluster address, or 0.0.0.0 for every interface "
        "(default 127.0.0.1: this machine only)",
    )
    server.add_argument("--port", type=int, default=5000)
    server.add_argument(
        "--backend-store-uri",
        help="where runs are kept; default: MLFLOW_TRACKING_URI when it is not a server, "
        "else sqlite:///mlflow.db in the working directory",
    )
    server.add_argument(
        "--artifacts-destination",
        help="where uploaded artifacts go (a directory or e.g. s3://bucket); default: mlruns/ "
        "beside a SQLite store, else ./mlartifacts",
    )
    server.add_argument("--workers", type=int, default=1, help="uvicorn workers (more for many clients)")
    server.add_argument("--dry-run", action="store_true", help="print the command only")
    server.set_defaults(handler=cmd_server)


def cmd_ui(args: argparse.Namespace) -> int:
    from raysim.config import TrackingConfig
    from raysim.tracking.links import remember_ui, ui_base
    from raysim.tracking.tracking_store import (
        absolute_uri,
        artifact_root,
        is_server,
        sqlite_path,
        tracking_uri,
    )

    uri = absolute_uri(args.tracking_uri or tracking_uri(TrackingConfig()))  # the server runs elsewhere
    if is_server(uri):  # a tracking server already serves its UI: nothing to start
        console.print(f"{uri} is a tracking server with its own UI: open {ui_base(uri)}", soft_wrap=True)
        with contextlib.suppress(OSError, ValueError):  # links are a courtesy: the server may want a login
            print_experiment_links(ui_base(uri), newest_experiment(ui_base(uri)))
        return 0
    command = mlflow_command(uri, host="127.0.0.1", port=args.port, workers=1)
    if artifact_root(uri):
        command += ["--default-artifact-root", str(artifact_root(uri))]
    if args.dry_run:
        console.print(" ".join(command), soft_wrap=True, markup=False)
        return 0
    database = sqlite_path(uri)
    if database is not None and not database.exists():
        raise DataError(
            f"no MLflow store at {database}: run a job first (raysim run JOB.yaml) in this "
            "directory, or pass --tracking-uri sqlite:///PATH/mlflow.db"
        )
    url = f"http://127.0.0.1:{args.port}"

    def ready(seconds: float, experiment: dict | None) -> None:
        remember_ui(uri, url)  # the links later runs print point here
        console.print(
            f"MLflow UI on [bold]{url}[/] (store {uri}), answered after {seconds:.1f} s; Ctrl-C stops it",
            soft_wrap=True,
        )
        print_experiment_links(url, experiment)

    return serve(command, "127.0.0.1", args.port, ready, store=uri)


def cmd_server(args: argparse.Namespace) -> int:
    from raysim.tracking.tracking_store import absolute_uri, artifact_root

    uri = absolute_uri(args.backend_store_uri or local_store_uri())  # the server runs in its folder
    destination = args.artifacts_destination or artifact_root(uri) or (Path.cwd() / "mlartifacts").as_uri()
    command = mlflow_command(uri, host=args.host, port=args.port, workers=args.workers)
    command += ["--serve-artifacts", "--artifacts-destination", destination]
    if args.dry_run:
        console.print(" ".join(command), soft_wrap=True, markup=False)
        return 0
    address = client_url(args.host, args.port)

    def ready(seconds: float, experiment: dict | None) -> None:
        console.print(
            f"MLflow tracking server on [bold]{address}[/] (store {uri}, artifacts {destination}), "
            f"answered after {seconds:.1f} s; Ctrl-C stops it",
            soft_wrap=True,
        )
        console.print(
            f"Clients log to it with  export MLFLOW_TRACKING_URI={address}\n(or per command: "
            f"tracking.tracking_uri={address} on raysim run, --tracking-uri {address} on raysim ui "
            "and raysim analyze)",
            soft_wrap=True,
            highlight=False,
        )
        if _is_loopback(args.host):
            console.print("[yellow]Only this machine reaches it:[/] pass --host with this node's address")
        print_experiment_links(address, experiment)

    return serve(command, local_address(args.host), args.port, ready, store=uri)


def local_store_uri() -> str:
    """MLFLOW_TRACKING_URI when it names a store (not a server), else SQLite in the working directory."""
    from raysim.tracking.tracking_store import is_server

    uri = os.environ.get("MLFLOW_TRACKING_URI")
    return uri if uri and not is_server(uri) else f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def mlflow_command(uri: str, host: str, port: int, workers: int) -> list[str]:
    mlflow = shutil.which("mlflow") or os.path.join(os.path.dirname(sys.executable), "mlflow")
    return [
        mlflow,
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def local_address(host: str) -> str:
    """The address this machine reaches a server bound to ``host`` at (URL form for IPv6)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def client_url(host: str, port: int) -> str:
    """The tracking URI for clients: the bound address, or this node's address for 0.0.0.0 / ::."""
    if host in ("", "0.0.0.0", "::"):
        host = node_address()
    return f"http://{local_address(host)}:{port}"


def node_address() -> str:
    """This node's address on its default route (no packet is sent), else its hostname's address."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        return str(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


def _is_loopback(host: str) -> bool:
    name = host.strip("[]")
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(name).is_loopback
    with contextlib.suppress(OSError):
        return ipaddress.ip_address(socket.gethostbyname(name)).is_loopback
    return False


class _Stopped(Exception):
    """SIGTERM or SIGHUP reached raysim."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def store_folder(uri: str | None) -> Path | None:
    """The folder of a SQLite store's database (None for other stores)."""
    from raysim.tracking.tracking_store import sqlite_path

    database = sqlite_path(uri) if uri else None
    return database.parent if database is not None else None


def serve(
    command: list[str],
    address: str,
    port: int,
    ready: Callable[[float, dict | None], None],
    store: str | None = None,
) -> int:
    """Runs the MLflow server until it exits or raysim is told to stop; then stops its process group.

    ``ready(seconds, newest_experiment)`` is called once the server answers. A SQLite ``store``'s
    server runs in the database's folder: raysim's relative artifact locations resolve there.

    Raises:
        ResourceError: the port is taken.
        RaysimError: the server exited, or did not answer, before it was ready (with its log).
    """
    if _answers_tcp(address, port):
        raise ResourceError(f"port {port} on {address} is taken (another raysim ui?): pass --port")
    log = Path(tempfile.mkstemp(prefix="raysim-mlflow-", suffix=".log")[1])
    with _signals_raise(), log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**LEAN_ENV, **os.environ},
            cwd=store_folder(store),
            start_new_session=True,  # its own process group: stopped as a whole, Ctrl-C reaches raysim only
            preexec_fn=_die_with_parent(),
        )
        try:
            started = time.monotonic()
            experiment = wait_until_ready(process, f"http://{address}:{port}", log)
            ready(time.monotonic() - started, experiment)
            code = process.wait()
            raise RaysimError(f"the MLflow server exited with code {code}; its log: {log}\n{_tail(log)}")
        except (KeyboardInterrupt, _Stopped):
            console.print("stopping the MLflow server")
        finally:
            with _signals_ignored():  # a second Ctrl-C must not cut the clean-up short
                stop_process_group(process)
    log.unlink()
    return 0


def wait_until_ready(
    process: subprocess.Popen, url: str, log: Path, timeout_s: float = START_TIMEOUT_S
) -> dict | None:
    """Polls the server's REST API until it answers; returns the newest experiment (None if none)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RaysimError(
                f"the MLflow server exited with code {process.returncode} before answering; "
                f"its log: {log}\n{_tail(log)}"
            )
        with contextlib.suppress(OSError, ValueError):
            return newest_experiment(url)
        time.sleep(0.25)
    raise RaysimError(
        f"the MLflow server did not answer within {timeout_s:.0f} s; its log: {log}\n{_tail(log)}"
    )


def newest_experiment(url: str) -> dict | None:
    """The most recently created experiment (id, name), None when the store has only MLflow's
    Default one. Raises OSError (URLError) while the server does not answer."""
    query = "max_results=1&order_by=creation_time%20DESC"
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?{query}", timeout=5) as reply:
        found = json.load(reply).get("experiments", [])
    return found[0] if found and found[0]["experiment_id"] != "0" else None


def stop_process_group(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process group ``process`` leads, SIGKILL to what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            process.poll()  # reaps the leader; its children are reaped by it or by init
            if not _group_alive(process.pid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. On Linux a zombie (dead, its exit status not yet
    collected by init) does not count: it holds no port and no memory."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, _parent, group = stat.read_text().rsplit(")", 1)[1].split()[:3]  # after "pid (name)"
            if int(group) == pgid and state != "Z":
                return True
    return False


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a function for the child before exec: the kernel sends it SIGTERM when raysim
    dies (PR_SET_PDEATHSIG = 1), even by SIGKILL; MLflow's launcher forwards SIGTERM to uvicorn.
    libc is loaded here, before the fork: the child only calls it."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)


def _answers_tcp(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address.strip("[]"), port), timeout=1):
        return True
    return False


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``_Stopped`` (as Ctrl-C raises KeyboardInterrupt) while serving;
    a signal ignored already stays ignored (``nohup raysim ui &`` outlives its terminal)."""
    signals = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, _stop) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
