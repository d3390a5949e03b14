"""Same config and seed -> same global model: serial backend, 1 and 2 Ray workers.

Bitwise for the same worker count (the serial backend shards into the same virtual workers and
merges in the same order); within 1e-6 relative across worker counts (float64 partial sums).
"""

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run


def final_params(tmp_path, backend, num_workers, algorithm="fedavg"):
    job = tiny_job(resources={"backend": backend, "num_workers": num_workers}, algorithm={"name": algorithm})
    return run(job, output_dir=tmp_path / f"{backend}{num_workers}{algorithm}").state.params


def assert_bitwise(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedfish"])
def test_serial_and_ray_agree(tmp_path, ray_local, algorithm):
    serial1 = final_params(tmp_path, "serial", 1, algorithm)
    ray1 = final_params(tmp_path, "ray", 1, algorithm)
    serial2 = final_params(tmp_path, "serial", 2, algorithm)
    ray2 = final_params(tmp_path, "ray", 2, algorithm)
    assert_bitwise(serial1, ray1)
    assert_bitwise(serial2, ray2)
    for k in serial1:
        assert torch.allclose(serial1[k], ray2[k], rtol=1e-6, atol=1e-7), k
    initial = initial_params()  # the runs really trained: every tensor moved from the init
    assert not any(torch.equal(serial1[k], initial[k]) for k in serial1)


def initial_params():
    from raysim import params as P
    from raysim.data.prepare import open_dataset
    from raysim.runtime.builders import build_job_model

    job = tiny_job()
    store = open_dataset(job.dataset.name, job.dataset.config)
    return P.model_params(build_job_model(job, store.spec))


def test_a_different_seed_gives_a_different_model(tmp_path):
    a = run(tiny_job(), output_dir=tmp_path / "a").state.params
    b = run(tiny_job(seed=4), output_dir=tmp_path / "b").state.params
    assert not any(torch.equal(a[k], b[k]) for k in a)


def test_batchnorm_buffers_are_averaged_and_agree_across_backends(tmp_path, ray_local):
    """A BatchNorm model under FedAdam: running statistics are averaged (never Adam-stepped),
    identically on the serial backend and on 2 Ray workers."""
    from raysim.config import JobConfig

    def final(backend):
        raw = tiny_job(
            algorithm={"name": "fedadam"},
            resources={"backend": backend, "num_workers": 2},
            engine={"num_rounds": 2},
        ).to_dict()
        raw["model"] = {"name": "resnet10", "width": 4}
        return run(JobConfig.from_dict(raw), output_dir=tmp_path / backend).state

    serial, on_ray = final("serial"), final("ray")
    means = [k for k in serial.params if k.endswith("running_mean")]
    assert means and all(k in serial.buffer_keys for k in means)
    assert all(k not in serial.opt_state.get("m", {}) for k in means)  # no Adam moments for buffers
    for k in serial.params:
        assert torch.allclose(serial.params[k], on_ray.params[k], rtol=1e-6, atol=1e-6), k
