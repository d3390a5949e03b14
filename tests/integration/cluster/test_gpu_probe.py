"""``gpus_per_worker: auto``'s probe on Ray, without a GPU: a Ray that declares one runs the probe
on it (a GPU node found, its data view taken, the pinned task started), and the task, finding no
CUDA device, fails with raysim's own error, not a Ray wrapper."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

PROBE = textwrap.dedent(
    """
    from raysim.config import JobConfig
    from raysim.engine.build import open_parts
    from raysim.errors import ResourceError
    from raysim.runtime.gpu_sizing import probe_work
    from raysim.runtime.ray_placement import probe_gpu_worker
    from raysim.runtime.ray_session import start_local_ray
    from raysim.runtime.wire import WorkerSetup

    job = JobConfig.from_dict({
        "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
        "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "fedavg"},
        "resources": {"backend": "ray", "gpus_per_worker": "auto"}, "tracking": {"enabled": False},
    })
    parts = open_parts(job)
    start_local_ray(num_cpus=1, num_gpus=1, log_to_driver=False)  # a GPU Ray counts, not a card
    setup = WorkerSetup(job.to_dict(), str(parts.store.path), STATE_DIR)
    work = probe_work(job, parts.algorithm, parts.params, parts.info, parts.store.num_examples("train"),
                      parts.train_pool)
    try:
        probe_gpu_worker(setup, job.resources, work)
    except ResourceError as exc:
        print("ResourceError:", exc)
    """
)


@pytest.mark.slow  # 20-50 s: a Ray of its own, which declares a GPU, in a fresh process
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_the_probe_runs_on_a_gpu_node_of_the_cluster_and_its_error_comes_back_as_itself(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    script = f"STATE_DIR = {str(tmp_path / 'state')!r}\n{PROBE}"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.strip() == (
        "ResourceError: resources.gpus_per_worker: auto measures a worker on a GPU, and this process has "
        "none; set resources.gpus_per_worker to 0 (CPU workers) or run where a GPU is"
    ), out.stderr[-2000:]
