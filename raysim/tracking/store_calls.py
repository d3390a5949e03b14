"""How raysim's processes call MLflow: every call to a tracking server bounded in time, and the
status of a run left to raysim alone.

MLflow's own HTTP settings (7 retries with exponential backoff, 120 s timeouts) spent 256 s on one
call to a server that was gone and 1,213 s on one to a server that accepts and never answers. And
MLflow's exit hook ends a run still active at exit as FINISHED, with those settings: a run whose
store did not take its last records (it stays RUNNING until ``raysim track upload``) exited 3 only
264-283 s after its server died, and one whose ``final.pt`` a full disk refused was marked FINISHED.
So raysim sets ``HTTP_DEFAULTS`` in its process where the user set nothing (child processes, its
sentinels included, inherit them), and unhooks MLflow's exit hook once it starts a run.

Usage:
    bound_store_calls()                     # the CLI, a tracker or a run store, before any call
    with call_settings(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0"):
        client.log_batch(...)               # one try: raysim's own default changed, a user's kept
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator

RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
BACKOFF = "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"
TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"
# One retry (a dropped keep-alive connection, a server restarting) after 1 s at most, 10 s for a
# connection or an answer: a call to a server that is away gives up within about 21 s.
HTTP_DEFAULTS = {RETRIES: "1", BACKOFF: "1", TIMEOUT: "10"}
_SET_BY_RAYSIM: set[str] = set()  # the keys of HTTP_DEFAULTS the user had not set


def bound_store_calls() -> None:
    """Sets ``HTTP_DEFAULTS`` in this process's environment where the user set nothing."""
    for key, value in HTTP_DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = value
            _SET_BY_RAYSIM.add(key)


def is_raysim_default(key: str) -> bool:
    """The setting is raysim's default (the user did not make it), which a call may change."""
    return key in _SET_BY_RAYSIM and os.environ.get(key) == HTTP_DEFAULTS[key]


@contextlib.contextmanager
def call_settings(**settings: str) -> Iterator[None]:
    """MLflow's HTTP settings changed for the calls inside, where they are raysim's defaults; those
    the user made stay."""
    bound_store_calls()
    changed = {key: value for key, value in settings.items() if is_raysim_default(key)}
    os.environ.update(changed)
    try:
        yield
    finally:
        os.environ.update({key: HTTP_DEFAULTS[key] for key in changed})


def unhook_mlflow_exit() -> None:
    """Takes MLflow's exit hook off (``mlflow.tracking.fluent._safe_end_run``): it ends a run still
    active at exit as FINISHED, whatever raysim decided, with a call that may wait on a store that
    is away. A run raysim could not end stays RUNNING; one whose driver died, its sentinel ends."""
    from mlflow.tracking import fluent

    hook = getattr(fluent, "_safe_end_run", None)
    if hook is not None:
        atexit.unregister(hook)


def forget_active_run(run_id: str) -> None:
    """Drops the run from MLflow's active runs in this thread, without telling the store: raysim
    could not end it (the store is away), and the next ``mlflow.start_run`` in this process would
    otherwise refuse, the run being still active."""
    from mlflow.tracking import fluent

    stack = getattr(fluent, "_active_run_stack", None)
    if stack is not None:
        active = stack.get()
        active[:] = [run for run in active if run.info.run_id != run_id]
