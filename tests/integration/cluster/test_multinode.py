"""A job on a Ray cluster of three nodes (``ray.cluster_utils.Cluster``): workers spread over the
nodes, the store shipped to every node through the object store, and a node removed mid-run
without changing the result.

The cluster runs in a child process (``cluster_run.py``): this process's Ray is the session's.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.runtime.shipping import fingerprint, shipped_root

HERE = Path(__file__).parent
REPO = HERE.parents[2]


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    """What cluster_run.py saw, and the final model of its run that lost a node."""
    out = tmp_path_factory.mktemp("cluster")
    ray_tmp = tempfile.mkdtemp(prefix="rs-", dir="/tmp")  # short: Ray's socket paths fit 107 bytes
    env = {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,  # ray.init() elsewhere never finds this cluster's address file
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # nodes stay on 127.0.0.1
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "cluster_run.py"), str(out)],
            env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads((out / "result.json").read_text()), torch.load(out / "params.pt")


def test_spread_workers_run_on_two_nodes_and_read_the_drivers_store(cluster_run):
    result, _ = cluster_run
    workers = result["spread"]
    assert len({w["node_id"] for w in workers}) == 2
    assert all(w["store"] == result["driver_store"] for w in workers)  # nothing shipped: same files


def test_a_shipped_store_is_opened_from_the_node_local_copy(cluster_run):
    result, _ = cluster_run
    workers = result["shipped"]
    assert len({w["node_id"] for w in workers}) == 2
    expected = fingerprint(result["driver_store"])
    for worker in workers:
        assert Path(worker["store"]) == shipped_root() / expected
        assert fingerprint(worker["store"]) == expected  # every file arrived whole


def test_a_node_removed_mid_run_leaves_the_result_unchanged(cluster_run, tmp_path):
    """The run goes on on the remaining node, and ends where a run without the fault ends: the
    serial backend with two virtual workers gives bitwise what two Ray workers give
    (test_determinism.py); losing one re-runs its clients elsewhere, which changes only the
    order of float64 additions."""
    result, params = cluster_run
    assert result["dead_workers"] == 1 and result["workers_left"] == 1
    assert result["seconds_after_loss"] < 60  # the lost worker's wait was bounded (2 s timeout)
    fault_free = run(tiny_job(resources={"backend": "serial", "num_workers": 2}), output_dir=tmp_path)
    for k, v in fault_free.state.params.items():
        assert torch.allclose(v, params[k], rtol=1e-6, atol=1e-7), k
