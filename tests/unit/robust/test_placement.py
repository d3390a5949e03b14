"""Where the driver runs a robust rule and in what chunks (raysim/robust/placement.py): the device
from robust.device and the workers' GPUs, chunks from robust.memory_mb, the rows refused when
they do not fit; the rules on a GPU as on the CPU (``pytest -m gpu``)."""

import byzantine_reference as ref
import numpy as np
import pytest
import torch
from gathered_rows import round_output

from raysim.config import JobConfig, deep_merge
from raysim.config.robust import (
    CenteredClip,
    GeometricMedian,
    Krum,
    Median,
    MultiKrum,
    NormBound,
    TrimmedMean,
)
from raysim.errors import ResourceError
from raysim.robust import placement, release
from raysim.robust.release import RunRobust

BASE = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
MiB = 2**20
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
ROWS = np.random.default_rng(2).normal(size=(7, 50)).astype(np.float32)
ROWS[6] += 30.0  # an outlier
COHORT = np.arange(7)


def job(device="auto", gpus=0.0):
    robust = {"rule": "median", "device": device}
    return JobConfig.from_dict(deep_merge(BASE, {"robust": robust, "resources": {"gpus_per_worker": gpus}}))


def output(rows=ROWS):
    return round_output(rows)


def test_auto_runs_on_the_cpu_where_the_workers_do_or_the_driver_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement.release_device(job(gpus=0.0)) == (CPU, "")
    device, note = placement.release_device(job(gpus=0.5))
    assert device == CPU and "the driver's process sees none" in note
    assert placement.release_device(job("cpu", gpus=0.5)) == (CPU, "")


def test_auto_runs_on_the_workers_gpu_where_the_driver_sees_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert placement.release_device(job(gpus=0.25)) == (CUDA, "")
    assert placement.release_device(job(gpus="auto")) == (CUDA, "")
    assert placement.release_device(job(gpus=0.0)) == (CPU, "")  # CPU workers: the rows are here
    assert placement.release_device(job("cuda", gpus=0.0)) == (CUDA, "")


def test_cuda_without_a_gpu_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ResourceError, match="robust.device: cuda, but the driver's process sees no CUDA"):
        placement.release_device(job("cuda"))


def test_a_budget_gives_the_widest_chunk_that_fits_it():
    n, d, memory_mb = 10, 100_000, 8.0
    chunk = placement.column_chunk(n, d, CPU, memory_mb)
    resident = n * d * 4 + d * placement.VECTOR_BYTES + n * n * placement.PAIR_BYTES
    assert resident + n * chunk * placement.CHUNK_BYTES <= memory_mb * MiB
    assert resident + n * (chunk + 1) * placement.CHUNK_BYTES > memory_mb * MiB
    assert placement.column_chunk(n, d, CPU, 1000.0) == d  # never wider than the rows
    assert placement.column_chunk(n, d, CPU, None) == 2**22 // n  # the CPU's default, as before


def test_rows_that_do_not_fit_the_budget_say_how_big_they_are_and_what_to_set():
    with pytest.raises(
        ResourceError, match=r"10 updates of 100,000 values take 4 MiB as float32 rows"
    ) as caught:
        placement.column_chunk(10, 100_000, CPU, 4.0)
    assert "raise robust.memory_mb" in str(caught.value) and "robust.device: cpu" in str(caught.value)


def test_auto_falls_back_to_the_cpu_where_the_card_has_no_room_unless_told_otherwise(monkeypatch):
    monkeypatch.setattr(placement, "free_bytes", lambda device: 1 * MiB)
    device, chunk, note = placement.placed(10, 100_000, CUDA, Median(rule="median"))
    assert (device, chunk) == (CPU, 2**22 // 10) and "do not fit the card's free memory" in note
    for insisting in (Median(rule="median", device="cuda"), Median(rule="median", memory_mb=1.0)):
        with pytest.raises(ResourceError, match="4 MiB as float32 rows"):
            placement.placed(10, 100_000, CUDA, insisting)


def test_the_rows_are_stacked_once_in_order():
    vectors = [torch.tensor(row) for row in ROWS]
    assert torch.equal(placement.stacked(vectors, CPU), torch.tensor(ROWS))


RULES = [
    (Median(rule="median", memory_mb=0.01), lambda x: ref.median(x)),
    (TrimmedMean(rule="trimmed_mean", beta=0.2, memory_mb=0.01), lambda x: ref.trimmed_mean(x, 0.2)),
    (MultiKrum(rule="multi_krum", f=1, m=3, memory_mb=0.01), lambda x: ref.multi_krum(x, 1, 3)[0]),
    (
        NormBound(rule="norm_bound", max_norm=5.0, memory_mb=0.01),
        lambda x: ref.norm_bounded_mean(x, np.ones(7), 5.0),
    ),
    (
        CenteredClip(rule="centered_clip", tau=2.0, iterations=2, memory_mb=0.01),
        lambda x: ref.centered_clip(x, np.zeros(50), 2.0, 2),
    ),
]


@pytest.mark.parametrize("rule, reference", RULES)
def test_a_release_chunks_as_its_budget_says_and_agrees_with_the_reference(monkeypatch, rule, reference):
    chunks = []
    apply = release.robust_vector
    monkeypatch.setattr(release, "robust_vector", lambda *a: chunks.append(a[4]) or apply(*a))
    released = RunRobust(rule, None, frozenset(), attacked=False).release(output(), COHORT, 0)
    assert chunks == [placement.column_chunk(7, 50, CPU, 0.01)] and 1 < chunks[0] < 50  # several chunks
    np.testing.assert_allclose(released.aggregate["w"].numpy(), reference(ROWS), rtol=1e-5, atol=1e-6)


GPU_RULES = [
    Median(rule="median"),
    TrimmedMean(rule="trimmed_mean", beta=0.2),
    Krum(rule="krum", f=2),
    MultiKrum(rule="multi_krum", f=1),
    GeometricMedian(rule="geometric_median"),
    NormBound(rule="norm_bound", max_norm=5.0),
    CenteredClip(rule="centered_clip", tau=2.0, iterations=3),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rule", GPU_RULES, ids=lambda rule: rule.rule)
def test_each_rule_on_the_gpu_gives_the_cpus_aggregate_on_the_cpu(rule):
    rows = np.random.default_rng(3).normal(size=(7, 300_000)).astype(np.float32)
    rows[6] += 3.0
    on_cpu = RunRobust(rule, None, frozenset(), attacked=False, device=CPU).release(output(rows), COHORT, 0)
    on_gpu = RunRobust(rule, None, frozenset(), attacked=False, device=CUDA).release(output(rows), COHORT, 0)
    assert on_gpu.aggregate["w"].device == CPU  # the plugin's server step runs on the CPU
    torch.testing.assert_close(on_gpu.aggregate["w"], on_cpu.aggregate["w"], rtol=1e-5, atol=1e-6)


def test_the_cpu_fallback_is_said_once_a_run(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    robust = RunRobust.of(job(gpus=0.5), np.arange(10))
    assert robust is not None and robust.device == CPU
    [line] = [r.getMessage() for r in caplog.records if "sees none" in r.getMessage()]
    robust.note(line)  # said again: not logged again
    robust.release(output(), COHORT, 0)
    assert [r.getMessage() for r in caplog.records].count(line) == 1
