"""``raysim submit JOB.yaml --address http://HOST:8265``: run a job on a Ray cluster as a Ray Job.

The cluster runs ``python -m raysim run JOB ...`` in an uploaded copy of the current directory
(Ray's ``working_dir``; ``raysim.cli.ray_jobs`` talks to Ray). What the job writes goes where
the user reads it, not into that copy in Ray's session folder: the MLflow store
(``MLFLOW_TRACKING_URI``) and the run directories with their checkpoints (``RAYSIM_HOME``), both
made absolute. The config is validated here first, so a typo fails before anything is uploaded.
The job's runs are tagged with this checkout's git commit, branch and dirty state (the upload has
no .git) and with the job's submission id, which raysim picks (``raysubmit_<hex>``).

Usage:
    raysim submit jobs/quickstart.yaml --address http://127.0.0.1:8265 engine.num_rounds=5
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from raysim.cli.home import raysim_home
from raysim.errors import ConfigError, RaysimError

if TYPE_CHECKING:
    from raysim.config import JobConfig

# Never uploaded: environments, caches, run stores and checkpoints (gitignore patterns, as Ray's
# runtime_env ``excludes``); Ray also honours .gitignore and .rayignore files.
EXCLUDES = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "mlflow.db*",
    "mlruns",
    "mlartifacts",
    ".raysim",
    "*.pt",
)
# Forwarded to the job as they are when set here (RAYSIM_CACHE and RAYSIM_PLUGIN_PATH are rewritten).
HF_OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
TRACKING_SERVER_HINT = (
    "start a tracking server the cluster can reach, e.g. `raysim server --host 0.0.0.0` (it prints "
    "the address to use), and pass --tracking-uri http://THIS_HOST:5000"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    submit = sub.add_parser(
        "submit",
        help="run a job on a Ray cluster (Ray Jobs), follow its logs",
        description="Submits `python -m raysim run JOB ...` as a Ray Job. The current directory "
        "is uploaded as the job's working directory (without .git, venvs, caches, MLflow stores, "
        ".raysim and *.pt files; .gitignore and .rayignore are honoured), so run it from the "
        "project folder that holds JOB. Runs are logged to --tracking-uri and checkpoints written "
        "under --output-dir, both as paths on this machine made absolute: on a cluster of other "
        "machines use an MLflow tracking server and shared storage.",
    )
    submit.add_argument("config", help="job YAML inside the current directory, e.g. jobs/quickstart.yaml")
    submit.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    submit.add_argument(
        "--address", required=True, help="the cluster's dashboard (job API), e.g. http://127.0.0.1:8265"
    )
    submit.add_argument("--variant", action="append", help="run only this variant (repeatable)")
    submit.add_argument(
        "--only", action="append", metavar="KEY=VALUE,...", help="a sweep: run only these cells"
    )
    submit.add_argument(
        "--confirm-cells", action="store_true", help="a sweep: more cells than sweep.max_cells"
    )
    submit.add_argument(
        "--output-dir",
        default=raysim_home(),
        help="where run directories (checkpoints) go, made absolute (default: RAYSIM_HOME, else .raysim)",
    )
    submit.add_argument(
        "--tracking-uri",
        help="MLflow store of the runs (default: the job's, else MLFLOW_TRACKING_URI, else "
        "sqlite:///mlflow.db here); a cluster of other machines needs a tracking server (http://...)",
    )
    submit.add_argument(
        "--no-follow", action="store_true", help="print the job id and return; do not follow the logs"
    )
    submit.set_defaults(handler=cmd_submit)


def cmd_submit(args: argparse.Namespace) -> int:
    from raysim.cli import ray_jobs
    from raysim.cli.console import console
    from raysim.config import load_jobs
    from raysim.config.cells import has_sweep, load_sweep

    jobs = load_jobs(args.config, args.overrides, args.variant)  # a bad config fails before any upload
    if has_sweep(args.config):  # its cells too; they run as tasks on the cluster (docs/sweeps.md)
        load_sweep(args.config, args.overrides, args.variant, args.only, args.confirm_cells)
    address = dashboard_url(args.address)
    submission = plan(args, jobs, Path.cwd(), os.environ)
    if any(job.tracking.enabled for job in jobs):
        check_store_for_cluster(
            submission.tracking_uri, address, is_local_address(address), explicit=bool(args.tracking_uri)
        )
    check_upload_size(Path.cwd())
    token = ray_jobs.auth_token(os.environ, Path.home())
    client = ray_jobs.connect(address, token)
    job_id = ray_jobs.submit(
        client, token, submission.entrypoint, submission.runtime_env, submission.submission_id
    )
    say = partial(console.print, soft_wrap=True, highlight=False, markup=False)
    try:  # from here on, Ctrl-C leaves the submitted job running and says how to reach it
        say(f"submitted Ray job {job_id} to {address}")
        say(f"runs: {submission.tracking_uri}")
        say(f"checkpoints: {submission.output_dir} (on the node running the job)")
        if args.no_follow:
            say(follow_hint(job_id, address, token))
            return 0
        status, message = ray_jobs.follow(client, job_id)
    except KeyboardInterrupt:
        say(
            f"stopped following; job {job_id} keeps running on the cluster.\n"
            + follow_hint(job_id, address, token)
        )
        return 130
    if status != "SUCCEEDED":
        say(f"job {job_id} {status}: {failure(message)}")
        return 1
    say(f"job {job_id} {status}")
    if is_local_store(submission.tracking_uri):
        say(f"MLflow UI: raysim ui --tracking-uri {submission.tracking_uri}")
    return 0


@dataclass(frozen=True)
class Submission:
    """What goes to the cluster: the command, its runtime_env, and where its results land."""

    entrypoint: str
    runtime_env: dict[str, Any]
    tracking_uri: str
    output_dir: Path
    submission_id: str  # the Ray Job's id, chosen here so that its runs can be tagged with it


def plan(
    args: argparse.Namespace,
    jobs: Sequence[JobConfig],
    cwd: Path,
    environ: Mapping[str, str],
    submission_id: str | None = None,
) -> Submission:
    """The submission of ``raysim submit ARGS`` run in ``cwd``: paths made absolute, the job's own
    relative tracking URI (which would beat MLFLOW_TRACKING_URI) overridden, the submitting
    checkout's git state and the submission id (default: a new one) in the job's environment."""
    from raysim.tracking.provenance import submission_env

    submission_id = submission_id or f"raysubmit_{uuid.uuid4().hex[:16]}"
    uri = tracking_uri_for(jobs, args.tracking_uri, environ, cwd)
    output_dir = absolute(args.output_dir, cwd)
    overrides = list(args.overrides)
    if any(job.tracking.tracking_uri for job in jobs):
        overrides.append(f"tracking.tracking_uri={uri}")
    return Submission(
        entrypoint=entrypoint(
            job_path_in(args.config, cwd), overrides, args.variant or [], sweep_flags(args)
        ),
        runtime_env=build_runtime_env(
            cwd, job_env(environ, cwd, uri, output_dir) | submission_env(jobs[0], submission_id)
        ),
        tracking_uri=uri,
        output_dir=output_dir,
        submission_id=submission_id,
    )


# --- what is submitted: pure functions of the command line and the environment -------------------------


def dashboard_url(address: str) -> str:
    """``HOST:8265`` -> ``http://HOST:8265`` (the job API is HTTP); no trailing slash."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def absolute(path: str | Path, cwd: Path) -> Path:
    """``path`` (``~`` expanded) as an absolute path, relative ones taken from ``cwd``."""
    return Path(os.path.normpath(cwd / Path(path).expanduser()))


def absolute_tracking_uri(uri: str, cwd: Path) -> str:
    """A tracking URI the job resolves the same way as this shell: a relative SQLite file or plain
    path is taken relative to ``cwd``. The job's own working directory is a temporary copy in Ray's
    session folder, where a relative store would be lost."""
    from raysim.tracking.tracking_store import absolute_uri

    if _is_path(uri):  # MLflow's file store
        return str(absolute(uri, cwd))
    return absolute_uri(uri, cwd)  # a SQLite file made absolute, other stores as they are


def is_local_store(uri: str) -> bool:
    """Whether the tracking URI names files on this machine (SQLite, a file store)."""
    return uri.startswith(("sqlite:", "file:")) or _is_path(uri)


def _is_path(uri: str) -> bool:
    return not urlsplit(uri).scheme and uri not in ("databricks", "databricks-uc")  # MLflow's bare names


def tracking_uri_for(
    jobs: Sequence[JobConfig], explicit: str | None, environ: Mapping[str, str], cwd: Path
) -> str:
    """--tracking-uri, else the job's ``tracking.tracking_uri``, else MLFLOW_TRACKING_URI, else
    ``sqlite:///mlflow.db`` here (what ``raysim run`` would use in ``cwd``), made absolute."""
    declared = sorted({job.tracking.tracking_uri for job in jobs if job.tracking.tracking_uri})
    if len(declared) > 1 and not explicit:
        raise ConfigError(
            [
                f"tracking.tracking_uri: the variants name several stores ({', '.join(declared)}); "
                "pick one with --tracking-uri"
            ]
        )
    uri = explicit or (declared[0] if declared else None) or environ.get("MLFLOW_TRACKING_URI")
    return absolute_tracking_uri(uri or "sqlite:///mlflow.db", cwd)


def job_path_in(config: str, cwd: Path) -> str:
    """The job file's path inside the uploaded directory (POSIX form, as the job sees it)."""
    path = absolute(config, cwd)
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        raise RaysimError(
            f"{config} is outside the current directory {cwd}, which is what gets uploaded: run "
            "raysim submit from the project folder that holds the job file"
        ) from None


def entrypoint(
    job_path: str, overrides: Sequence[str], variants: Sequence[str], flags: Sequence[str] = ()
) -> str:
    """The shell command the cluster runs: ``python -m raysim run JOB [overrides] [--variant V]``."""
    variant_flags = [flag for name in variants for flag in ("--variant", name)]
    return shlex.join(["python", "-m", "raysim", "run", job_path, *overrides, *variant_flags, *flags])


def sweep_flags(args: argparse.Namespace) -> list[str]:
    """A sweep's ``--only`` and ``--confirm-cells``, handed on to ``raysim run`` on the cluster."""
    only = [flag for text in getattr(args, "only", None) or [] for flag in ("--only", text)]
    return only + (["--confirm-cells"] if getattr(args, "confirm_cells", False) else [])


def job_env(environ: Mapping[str, str], cwd: Path, tracking_uri: str, output_dir: Path) -> dict[str, str]:
    """Environment variables of the job: where runs and checkpoints go, and the settings of this
    shell that the job needs to behave as ``raysim run`` would here.

    RAYSIM_PLUGIN_PATH folders inside ``cwd`` become relative (the job runs in the uploaded copy of
    ``cwd``); those outside, and RAYSIM_CACHE, become absolute (shared storage on a cluster).
    """
    env = {"MLFLOW_TRACKING_URI": tracking_uri, "RAYSIM_HOME": str(output_dir)}
    if environ.get("RAYSIM_CACHE"):
        env["RAYSIM_CACHE"] = str(absolute(environ["RAYSIM_CACHE"], cwd))
    if environ.get("RAYSIM_PLUGIN_PATH"):
        folders = [p for p in environ["RAYSIM_PLUGIN_PATH"].split(os.pathsep) if p]
        env["RAYSIM_PLUGIN_PATH"] = os.pathsep.join(_in_upload(absolute(p, cwd), cwd) for p in folders)
    env |= {key: environ[key] for key in HF_OFFLINE if key in environ}
    return env


def _in_upload(path: Path, cwd: Path) -> str:
    return path.relative_to(cwd).as_posix() if path.is_relative_to(cwd) else str(path)


def build_runtime_env(cwd: Path, env_vars: Mapping[str, str]) -> dict[str, Any]:
    """Ray's runtime_env: ``cwd`` as the working directory, less EXCLUDES, with ``env_vars``."""
    return {"working_dir": str(cwd), "excludes": list(EXCLUDES), "env_vars": dict(env_vars)}


# --- checks that fail in seconds, naming the fix --------------------------------------------------------


def is_local_address(url: str) -> bool:
    """Whether the cluster's address is this machine (loopback, its name or one of its addresses):
    only then can the job write files whose paths are this machine's."""
    host = urlsplit(url).hostname or ""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
    return ip.is_loopback or str(ip) in _machine_addresses()


def _machine_addresses() -> set[str]:
    import psutil  # with ray[default]

    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}


def check_store_for_cluster(uri: str, address: str, local: bool, explicit: bool) -> None:
    """A store of files on this machine cannot take runs from a cluster of other machines.

    Raises:
        ConfigError: the cluster is remote and the store a local file the user did not name
            explicitly (named with --tracking-uri, it is taken to be on shared storage, with a warning).
    """
    from raysim.cli.console import err_console

    if local:
        return
    if is_local_store(uri):
        problem = (
            f"the MLflow store {uri} is a file on this machine, but the job runs on the cluster "
            f"at {address}, which cannot write it"
        )
        if not explicit:
            raise ConfigError([f"tracking: {problem}: {TRACKING_SERVER_HINT}"])
        err_console.print(
            f"[bold yellow]warning:[/] {problem} unless the path is on storage shared with every "
            f"node; otherwise {TRACKING_SERVER_HINT}",
            soft_wrap=True,
            highlight=False,
        )
    elif is_local_address(uri):
        err_console.print(
            f"[bold yellow]warning:[/] the tracking server {uri} is this machine's loopback; the job "
            f"on {address} would reach its own: give an address of this machine the cluster can reach",
            soft_wrap=True,
            highlight=False,
        )


def check_upload_size(root: Path, limit: int | None = None) -> None:
    """Raises RaysimError naming the biggest entries when ``root`` is over Ray's upload limit."""
    from raysim.cli.ray_jobs import UPLOAD_LIMIT, upload_sizes

    limit = UPLOAD_LIMIT if limit is None else limit
    sizes = upload_sizes(root, EXCLUDES)
    total = sum(sizes.values())
    if total <= limit:
        return
    biggest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    raise RaysimError(
        f"{root} holds {_mib(total)} to upload as the job's working directory, over Ray's limit of "
        f"{_mib(limit)}; the biggest: {', '.join(f'{name} ({_mib(size)})' for name, size in biggest)}. "
        "List what the job does not need in a .rayignore file there (gitignore syntax), and keep "
        "data in dataset.cache_dir / RAYSIM_CACHE on storage the cluster reads"
    )


def _mib(size: int) -> str:
    return f"{size / 1024**2:,.1f} MiB"


def failure(message: str) -> str:
    """Ray's account of a failed job, less the copy of the logs just followed, with the fix when
    the cluster's Python lacks raysim."""
    lacks_raysim = "No module named raysim" in message
    message = message.split(", last available logs")[0]
    if lacks_raysim:
        message += (
            "\nThe cluster runs the job with the `python` on its PATH, which lacks raysim: start "
            "the head (`ray start --head`) from the environment where raysim is installed "
            "(its bin/ first on PATH)"
        )
    return message


def follow_hint(job_id: str, address: str, token: str | None) -> str:
    """Ray's own commands to follow or stop the job (which send a token only with RAY_AUTH_MODE=token)."""
    prefix = "RAY_AUTH_MODE=token " if token and os.environ.get("RAY_AUTH_MODE") != "token" else ""
    return (
        f"follow it: {prefix}ray job logs {job_id} --address {address} --follow\n"
        f"stop it:   {prefix}ray job stop {job_id} --address {address}"
    )
