"""The driver's Ray: ``ray.init`` on a cluster or a local Ray on loopback only, and its sentinel.

``init_ray`` connects to the cluster a job names (``resources.address`` / RAY_ADDRESS) or starts
a Ray of this process's own whose servers listen on 127.0.0.1 only (``start_local_ray``), watched
by a sentinel that reaps the node should the driver be killed outright (``sentinel.py``).

Usage:
    init_ray(ResourcesConfig())
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import RayTaskError

from raysim.config import ResourcesConfig
from raysim.errors import RaysimError, ResourceError
from raysim.runtime.sentinel import Sentinel

LOOPBACK = "127.0.0.1"
# Ray 2.60 logs "Token authentication is enabled for this Ray cluster" at every ray.init.
_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def init_ray(resources: ResourcesConfig) -> None:
    """Connects to a cluster (``address`` / RAY_ADDRESS) or starts a local Ray, once.

    A local Ray listens on 127.0.0.1 only (``start_local_ray``).
    """
    if ray.is_initialized():
        return
    address = configured_address(resources)
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if not os.environ.get("RAYSIM_DEBUG"):  # a notice that asks nothing of the user (RAYSIM_DEBUG shows it)
        logging.getLogger(_TOKEN_NOTICE_LOGGER).setLevel(logging.ERROR)
    with driver_keeps_sigterm():
        if address and address != "local":
            ray.init(address=address, include_dashboard=False, **options)
        else:  # "local" too: a Ray of its own, on loopback, watched by a sentinel
            start_local_ray(**options)


@contextmanager
def driver_keeps_sigterm() -> Iterator[None]:
    """While Ray starts, a SIGTERM reaches the driver's own handler, as it does later: the run ends
    through its clean-up with exit code 143, as on the serial backend.

    ``ray.init`` replaces a SIGTERM handler twice through ``ray._private.utils.set_sigterm_handler``
    (one that exits with 15, then the node's, which exits with 1), and its core worker installs a
    C++ one that dumps a stack trace and aborts (134). The first two are kept out for the call;
    the driver's handler is put back over the third as the call returns (Ray installs it in the
    call's last few milliseconds). A process without a handler of its own keeps Ray's.
    """
    driver_handler = signal.getsignal(signal.SIGTERM)
    if not callable(driver_handler) or threading.current_thread() is not threading.main_thread():
        yield
        return
    from ray._private import utils as ray_utils

    rays_setter = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = rays_setter
        signal.signal(signal.SIGTERM, driver_handler)


def configured_address(resources: ResourcesConfig) -> str:
    """The address the job names: ``resources.address``, else RAY_ADDRESS, else "" (a local Ray)."""
    return resources.address or os.environ.get("RAY_ADDRESS", "")


def cluster_address(resources: ResourcesConfig) -> str | None:
    """The ``host:port`` (or ``ray://...``) of the cluster ``init_ray`` would connect to; None when it
    starts a Ray of its own, or one runs in this process already.

    Raises:
        ResourceError: ``auto`` and no cluster of this machine found.
    """
    address = configured_address(resources)
    if ray.is_initialized() or not address or address == "local":
        return None
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except ConnectionError as exc:
        raise ResourceError(
            f"resources.address / RAY_ADDRESS is 'auto', and no Ray cluster was found here: {exc}"
        ) from None


def local_ray_options(**options: Any) -> dict[str, Any]:
    """``ray.init`` arguments of a Ray that serves this machine only: a new instance (``address``
    "local": never one that ``ray start`` left running, which ``ray.init()`` would otherwise join,
    refusing ``num_cpus``), no dashboard, the node's address and the dashboard's host on the
    loopback interface; ``options`` add to them."""
    return {
        "address": "local",
        "include_dashboard": False,
        "dashboard_host": LOOPBACK,
        "_node_ip_address": LOOPBACK,
    } | options


def start_local_ray(**options: Any) -> None:
    """Starts a Ray on this machine whose processes listen on 127.0.0.1 only.

    Ray binds its GCS, raylet, worker, agent and metrics servers to the loopback interface
    exactly when the node's address is loopback, and to every interface otherwise. But
    ``ray.init`` (Ray 2.60) swaps a loopback ``_node_ip_address`` for the machine's routable
    address, unless Ray was imported with cluster support switched off
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read once into ``ray_constants``). So cluster
    support is off while this call starts the node, and back on afterwards: a later connection
    to a real cluster is unaffected.

    Usage:
        start_local_ray(num_cpus=2, log_to_driver=False)
    """
    from ray._private import ray_constants

    supports_clusters = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(**local_ray_options(**options))
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = supports_clusters
    global _node_sentinel
    _node_sentinel = watch_local_node()  # held for the process's life: its pipe closing is the signal


_node_sentinel: Sentinel | None = None  # the sentinel of the Ray node this process started


def watch_local_node() -> Sentinel:
    """A sentinel that kills what is left of the Ray node this driver started, should the driver be
    killed outright (``raysim.runtime.sentinel``): no Ray process outlives it by more than seconds."""
    import psutil

    node = ray._private.worker._global_node
    assert node is not None, "ray.init started no node"
    processes = [info.process.pid for infos in node.all_processes.values() for info in infos]
    alive = []
    for pid in processes:
        try:
            alive.append(f"{pid}:{psutil.Process(pid).create_time()}")
        except psutil.Error:
            pass
    return Sentinel.start("reap-ray", node.get_session_dir_path(), *alive)


def ray_result(refs: Any) -> Any:
    """``ray.get``, re-raising a raysim error from inside a worker as itself (no Ray wrapper).

    A worker Ray restarted mid-run whose constructor raised (on a node that cannot read the data,
    say) is a lost worker: RayActorError.
    """
    try:
        return ray.get(refs)
    except RayTaskError as exc:
        if isinstance(exc.cause, RaysimError):
            raise exc.cause from None
        raise
