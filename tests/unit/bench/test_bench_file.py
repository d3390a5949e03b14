"""A benchmark file's device: the plain loop and the vectorized side train where the job's GPU is."""

import pytest
import torch

from raysim.bench.bench_file import bench_device, load_benchmark
from raysim.errors import ConfigError

JOB = "jobs/bench/pfl_cifar10_gpu.yaml"  # asks for a GPU: resources.gpus_per_worker 0.25


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_asked_where_torch_sees_none_is_one_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"bench\.device: cuda, but torch sees no CUDA device"):
        load_benchmark(JOB, ["bench.device=cuda"])


def test_auto_follows_the_job_and_falls_back_to_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    job, bench = load_benchmark(JOB, [])
    assert bench_device(job, bench).type == "cuda"
    job, bench = load_benchmark(JOB, ["resources.gpus_per_worker=0"])
    assert bench_device(job, bench).type == "cpu"  # a CPU job's loop stays on the CPU
    job, bench = load_benchmark(JOB, ["bench.device=cpu"])
    assert bench_device(job, bench).type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    job, bench = load_benchmark(JOB, [])
    assert bench_device(job, bench).type == "cpu"  # auto on a machine without a GPU
