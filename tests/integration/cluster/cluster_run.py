"""Runs tiny jobs on a ``ray.cluster_utils.Cluster``: a head node with no CPU (the driver's) and
two worker nodes of one CPU each. Writes what ``test_multinode.py`` checks to OUT/result.json and
the final global model of the run that lost a node to OUT/params.pt.

It runs in a process of its own: a process connects to one Ray only, and the test session's Ray
(tests/conftest.py ``ray_local``) is another. The caller sets RAY_TMPDIR (so that ``ray.init()``
elsewhere on the machine never finds this cluster) and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (so
that Ray keeps 127.0.0.1 as every node's address).

Usage:
    python tests/integration/cluster/cluster_run.py OUT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import ray
import torch
from ray.cluster_utils import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/integration/jobs.py
from jobs import tiny_job  # noqa: E402
from raysim.engine.build import build  # noqa: E402
from raysim.tracking.tracker import MemoryTracker  # noqa: E402

NODE = {"include_dashboard": False, "node_ip_address": "127.0.0.1"}
RESTART_TIMEOUT_S = 2.0


def places(engine) -> list[dict[str, str]]:
    return [{"node_id": p.node_id, "store": p.store_path} for p in engine.backend.places]


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **NODE})
    nodes = [cluster.add_node(num_cpus=1, **NODE) for _ in range(2)]
    cluster.wait_for_nodes()
    result: dict[str, object] = {}
    try:
        resources = {"backend": "ray", "num_workers": 2, "address": cluster.address}
        # The default: every node reads the driver's store (one machine: one file system).
        spread, _ = build(
            tiny_job(resources={**resources, "placement": "spread"}), MemoryTracker(), None, out / "spread"
        )
        result["spread"] = places(spread)
        result["driver_store"] = str(spread.store.path)
        spread.backend.shutdown()

        # Every store shipped; one node removed after round 0, its worker's reservation cannot be
        # placed again (each node holds one worker), so it leaves the pool after the timeout.
        job = tiny_job(
            resources={
                **resources,
                "placement": "STRICT_SPREAD",
                "ship_data": "always",
                "max_worker_restarts": 1,
                "restart_timeout_s": RESTART_TIMEOUT_S,
            }
        )
        engine, state = build(job, MemoryTracker(), None, out / "faulty")
        result["shipped"] = places(engine)
        try:
            state, _ = engine.run_round(state, 0)
            lost = next(n for n in nodes if n.node_id == engine.backend.places[1].node_id)
            cluster.remove_node(lost)
            start = time.perf_counter()
            for round_num in range(1, job.engine.num_rounds):
                state, _ = engine.run_round(state, round_num)
            result["seconds_after_loss"] = time.perf_counter() - start
            result["dead_workers"] = engine.backend.dead_workers
            result["workers_left"] = len(engine.backend.workers)
        finally:
            engine.backend.shutdown()
        torch.save(state.params, out / "params.pt")
    finally:
        ray.shutdown()
        cluster.shutdown()
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
