"""A benchmark file: read as a job file is, and its device (the plain loop and the vectorized side
train where the job's GPU is)."""

import pytest
import torch

from raysim.bench.bench_file import bench_device, check_gpu_rounds, load_benchmark
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


def test_a_gpu_figure_needs_two_warm_up_and_ten_timed_rounds_and_a_cpu_one_does_not():
    job, bench = load_benchmark("jobs/bench/pfl_cifar10.yaml", ["engine.num_rounds=4"])  # 1 + 3
    check_gpu_rounds(job, bench, torch.device("cpu"))  # the CPU's figures are the reader's to judge
    with pytest.raises(
        ConfigError, match=r"at least 2 warm-up and 10 timed rounds, got 1 and 3; raise bench"
    ):
        check_gpu_rounds(job, bench, torch.device("cuda"))
    job, bench = load_benchmark(
        "jobs/bench/pfl_cifar10.yaml", ["engine.num_rounds=12", "bench.warmup_rounds=2"]
    )
    check_gpu_rounds(job, bench, torch.device("cuda"))  # 2 + 10: enough
    gpu_job, gpu_bench = load_benchmark("jobs/bench/pfl_cifar10_gpu.yaml", [])
    check_gpu_rounds(gpu_job, gpu_bench, torch.device("cuda"))  # the GPU benchmark as shipped


def test_a_bench_file_is_read_as_a_job_file_is(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: x\n  b: [u\n")  # a YAML traceback before
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_benchmark(tmp_path / "bad.yaml", [])
    (tmp_path / "binary.yaml").write_bytes(b"\xff")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_benchmark(tmp_path / "binary.yaml", [])
    with pytest.raises(ConfigError, match="no such job file"):
        load_benchmark(tmp_path / "missing.yaml", [])
