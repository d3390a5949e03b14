"""What an MLflow run says about where it came from: its name ``job/variant`` plus what the
command line changed, the command line, and the git commit of the repository holding the job file
(for a run submitted as a Ray Job: of the submitting checkout, and the Ray Job's submission id).

Usage:
    run_name(job)                  # "quickstart/fedprox mu=1.0 num_rounds=6"
    run_name(job, ["lr=0.1"])      # extra parts (a sweep cell's axes) go after the overrides
    source_tags(job)  # {"mlflow.source.name": "raysim run jobs/quickstart.yaml", ...}
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from raysim.config import JobConfig

GIT_COMMIT = "mlflow.source.git.commit"
GIT_BRANCH = "mlflow.source.git.branch"
GIT_REPO = "mlflow.source.git.repoURL"
GIT_DIRTY = "git_dirty"  # "true": the job's repository had uncommitted changes (or untracked files)
SOURCE_NAME = "mlflow.source.name"
OVERRIDES = "raysim.overrides"  # the command line's overrides of the run's variant, as typed
SUBMISSION_ID = "ray.submission_id"  # the Ray Job a submitted run ran in (`ray job logs ID`)
# Set by `raysim submit` in the job's environment: the uploaded copy has no .git to read.
SUBMITTED_GIT_ENV, SUBMISSION_ID_ENV = "RAYSIM_SUBMITTED_GIT", "RAYSIM_SUBMISSION_ID"
_GIT_TIMEOUT_S = 10
_UNNAMED_SECTIONS = ("tracking.", "resources.")  # where and how a run goes, not what it computes
_MAX_PART_CHARS = 24


def run_name(job: JobConfig, extra: Sequence[str] = ()) -> str:
    """``tracking.run_name``, else ``job/variant`` for a job file's variant (the job's name for
    one built in Python) followed by its overrides, short: ``quickstart/fedavg num_rounds=6``.
    ``extra`` parts (``seed=1``) follow, so runs that differ in them differ in name too."""
    origin = job.origin
    changes: list[str] = []
    if job.tracking.run_name:
        base = job.tracking.run_name
    elif origin is None:  # built in Python, not loaded from a file
        base = job.name
    else:
        base = f"{origin.job}/{origin.variant}" if origin.variant else origin.job
        changes = [short_override(o) for o in origin.overrides if not o.startswith(_UNNAMED_SECTIONS)]
    return " ".join([base, *changes, *extra])


def short_override(override: str) -> str:
    """``lr=0.1`` for ``algorithm.local.lr=0.1``; ``algorithm=fedprox`` for ``algorithm.name=...``:
    the key's last part (its section's, for a plugin's name), the value cut to a legend's width."""
    key, _, value = override.partition("=")
    parts = key.split(".")
    label = parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]
    value = value if len(value) <= _MAX_PART_CHARS else value[: _MAX_PART_CHARS - 1] + "…"
    return f"{label}={value}"


def naming_tags(job: JobConfig) -> dict[str, str]:
    """``job`` and ``variant`` tags, to filter runs by in MLflow (``tags.variant = 'fedavg'``),
    and the variant's overrides (``raysim.overrides``) when the command line gave any."""
    origin = job.origin
    if origin is None:
        return {"job": job.name}
    overrides = {OVERRIDES: shlex.join(origin.overrides)} if origin.overrides else {}
    return {"job": origin.job, **({"variant": origin.variant} if origin.variant else {}), **overrides}


def source_tags(job: JobConfig, argv: list[str] | None = None) -> dict[str, str]:
    """The command line as ``mlflow.source.name``, and the job file's git commit, branch,
    repository and whether its tree was dirty. MLflow's own git tags describe the repository of
    the running script (the ``raysim`` executable), which is not where the job lives."""
    tags = {SOURCE_NAME: command_line(sys.argv if argv is None else argv)}
    submitted = submitted_tags(os.environ)
    if submitted:  # a Ray Job: the submitting checkout's git state, read at submit time
        return tags | submitted
    if job.origin is not None:
        tags |= git_tags(Path(job.origin.path).parent)
    return tags


def submission_env(job: JobConfig, submission_id: str) -> dict[str, str]:
    """The environment ``raysim submit`` gives a Ray Job so that its runs carry the submitting
    checkout's git tags (the upload holds no .git) and the job's submission id."""
    git = git_tags(Path(job.origin.path).parent) if job.origin is not None else {}
    return {SUBMITTED_GIT_ENV: json.dumps(git), SUBMISSION_ID_ENV: submission_id}


def submitted_tags(environ: Mapping[str, str]) -> dict[str, str]:
    """The tags ``submission_env`` passed; empty outside a submitted job."""
    if SUBMISSION_ID_ENV not in environ:
        return {}
    git = json.loads(environ.get(SUBMITTED_GIT_ENV) or "{}")
    return {**{str(k): str(v) for k, v in git.items()}, SUBMISSION_ID: environ[SUBMISSION_ID_ENV]}


def command_line(argv: list[str]) -> str:
    """``raysim run jobs/quickstart.yaml x=1`` however raysim was started (its console script,
    ``python -m raysim``); any other program's command line as it is."""
    if not argv:
        return "<python>"
    program = Path(argv[0])
    if program.name == "raysim" or (program.name == "__main__.py" and program.parent.name == "raysim"):
        return shlex.join(["raysim", *argv[1:]])
    return shlex.join(argv)


def git_tags(folder: Path) -> dict[str, str]:
    """The git state of the repository holding ``folder``; empty outside one (or without git)."""
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return {}
    status = _git(folder, "status", "--porcelain")
    tags = {GIT_COMMIT: commit, GIT_DIRTY: "true" if status else "false"}
    branch = _git(folder, "rev-parse", "--abbrev-ref", "HEAD")
    if branch and branch != "HEAD":  # "HEAD": a detached checkout has no branch
        tags[GIT_BRANCH] = branch
    remote = _git(folder, "config", "--get", "remote.origin.url")
    repo = remote or _git(folder, "rev-parse", "--show-toplevel")  # no remote: the local folder
    if repo:
        tags[GIT_REPO] = repo
    return tags


def _git(folder: Path, *args: str) -> str | None:
    """A git command's output in ``folder``; None when it fails (no repository, no git)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=_GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
