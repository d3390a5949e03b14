"""``raysim bench``'s ideal: the plain loop's time over the cores raysim's workers train on."""

import pytest
import torch

from raysim.bench.bench_file import load_benchmark
from raysim.bench.round_bench import phase_spread, raysim_alone, summarize, training_cores

JOB = "jobs/bench/pfl_cifar10.yaml"  # Ray workers on the CPU, one thread each
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_ideal_counts_each_workers_threads_on_the_cpu_and_one_per_worker_elsewhere():
    job, _ = load_benchmark(JOB, [])
    assert training_cores(job, 2, CPU) == 2
    two_threads, _ = load_benchmark(JOB, ["resources.cpus_per_worker=2"])
    assert training_cores(two_threads, 1, CPU) == 2 and training_cores(two_threads, 3, CPU) == 6
    assert training_cores(two_threads, 1, CUDA) == 1  # a card's workers share the card
    serial, _ = load_benchmark(JOB, ["resources.backend=serial", "resources.cpus_per_worker=2"])
    assert training_cores(serial, 2, CPU) == 2  # the serial backend's workers take turns


def test_raysim_over_the_ideal_is_the_ratio_of_the_medians_with_the_spread_of_each_rounds_ratio():
    job, _ = load_benchmark(JOB, [])
    raysim_s, plain_s = [3.0, 2.0, 4.0, 10.0], [4.0, 4.0, 4.0, 8.0]
    figures = summarize(job, 1, 2, raysim_s, plain_s)
    assert figures["ideal_round_s"] == pytest.approx(2.0)  # the plain loop's median (4.0) over 2 cores
    assert figures["ratio_to_ideal"] == pytest.approx(3.5 / 2.0)  # the medians: 3.5 over 4.0 / 2
    # per round: 1.5, 1.0, 2.0, 2.5; their quartiles by linear interpolation: 1.375 and 2.125
    assert figures["ratio_to_ideal_iqr"] == pytest.approx([1.375, 2.125])
    assert figures["ratio_to_ideal_median_of_round_ratios"] == pytest.approx(1.75)  # named, not the headline
    assert figures["timed_rounds"] == 4
    assert (figures["num_workers"], figures["cores"]) == (1, 2)


def test_without_the_plain_loop_raysims_rounds_stand_alone():
    job, bench = load_benchmark("jobs/bench/pfl_cifar10_cohort1000.yaml", [])
    assert not bench.plain_loop and job.engine.cohort_size == 1000
    figures = raysim_alone(job, 2, [2.0, 4.0, 5.0])
    assert figures["raysim_clients_per_s"] == pytest.approx(1000 / 4.0)
    assert not any(key.startswith(("plain", "ratio", "ideal")) for key in figures)


def test_the_rounds_spread_is_put_on_the_phase_that_varies_most():
    # four rounds: training steady at 1.0 s, data loading 0.1-0.9 s, the wall time their sum
    loading = [0.1, 0.9, 0.1, 0.9]
    phases = [
        {"sys/time/wall_s": 1.0 + d, "sys/time/training_s": 1.0, "sys/time/data_loading_s": d}
        for d in loading
    ]
    spread = phase_spread(phases)
    # the 25th and 75th percentiles of [0.1, 0.1, 0.9, 0.9] by linear interpolation: 0.1 and 0.9
    assert spread["spread_phase"] == "data_loading"
    assert spread["spread_phase_s"] == pytest.approx(0.8)
    assert spread["round_spread_s"] == pytest.approx(0.8)
    assert spread["phase_spread_s"]["sys/time/training_s"] == 0.0
    assert phase_spread(phases[:1]) == {} and phase_spread([{}, {}]) == {}
