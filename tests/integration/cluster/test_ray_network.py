"""A Ray that raysim starts on this machine listens on the loopback interface only: GCS, raylet,
workers, agents and their metrics endpoints are unreachable from the network."""

import ipaddress
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from raysim.config import ResourcesConfig
from raysim.runtime import ray_session

# Processes a local Ray always runs once a task has run (matched in their command lines).
CORE = ("gcs_server", "raylet", "DashboardAgent", "RuntimeEnvAgent")


def listening_sockets(root: psutil.Process) -> dict[str, list[str]]:
    """Command line -> bound IPs of the listening TCP sockets, for ``root`` and its descendants."""
    found = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            command = " ".join(proc.cmdline())[:120]
            ips = [c.laddr.ip for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # a process that ended meanwhile listens on nothing
        if ips:
            found[command] = ips
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def ray_sockets(root: psutil.Process) -> dict[str, list[str]]:
    """The listening sockets once every core Ray process listens (agents start a little later)."""
    deadline = time.monotonic() + 60
    while True:
        found = listening_sockets(root)
        missing = [name for name in CORE if not any(name in command for command in found)]
        if not missing or time.monotonic() > deadline:
            assert not missing, f"Ray processes not listening: {missing}; found {found}"
            return found
        time.sleep(1)


def assert_loopback_only(found: dict[str, list[str]]) -> None:
    exposed = {command: ips for command, ips in found.items() if not all(map(is_loopback, ips))}
    assert not exposed, f"Ray processes listen beyond the loopback interface: {exposed}"


@pytest.mark.slow  # ~25 s: a second Ray, started by raysim's own init_ray in a fresh process
def test_the_ray_raysim_starts_listens_on_loopback_only(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import ray
        from raysim.config import ResourcesConfig
        from raysim.runtime.ray_session import init_ray

        init_ray(ResourcesConfig())
        ray.get(ray.remote(lambda: 1).remote())  # a worker process, with its own server
        print("ready", flush=True)
        sys.stdin.readline()
        ray.shutdown()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        found = ray_sockets(psutil.Process(child.pid))
    finally:
        child.communicate("done\n", timeout=120)
    assert_loopback_only(found)


def test_the_session_ray_of_the_tests_listens_on_loopback_only(ray_local):
    ray_local.get(ray_local.remote(lambda: 1).remote())
    assert_loopback_only(ray_sockets(psutil.Process()))


def test_raysim_starts_a_loopback_ray_unless_given_a_cluster(monkeypatch):
    calls = []
    monkeypatch.setattr(ray_session.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_session.ray, "init", lambda **kw: calls.append(("cluster", kw)))
    monkeypatch.setattr(ray_session, "start_local_ray", lambda **kw: calls.append(("local", kw)))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_session.init_ray(ResourcesConfig())
    ray_session.init_ray(ResourcesConfig(address="10.0.0.5:6379"))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.6:6379")
    ray_session.init_ray(ResourcesConfig())
    assert [(kind, kw.get("address")) for kind, kw in calls] == [
        ("local", None),
        ("cluster", "10.0.0.5:6379"),
        ("cluster", "10.0.0.6:6379"),
    ]
    assert all("_node_ip_address" not in kw for kind, kw in calls if kind == "cluster")


def test_local_ray_options_keep_every_server_on_loopback():
    options = ray_session.local_ray_options(num_cpus=2)
    assert options["_node_ip_address"] == options["dashboard_host"] == "127.0.0.1"
    assert options["num_cpus"] == 2 and options["include_dashboard"] is False
    assert options["address"] == "local"  # a new instance, never a `ray start` cluster left running


def test_loopback_addresses_are_told_apart():
    assert all(map(is_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1"]))
