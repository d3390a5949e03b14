"""``raysim bench``'s plain loop in parallel: each process trains its own share of the cohort,
together the whole cohort, and the round's time is the slowest process's."""

import torch

from jobs import tiny_job
from raysim.bench.plain_loop import ParallelPlainLoop, PlainLoop
from raysim.engine.build import build
from raysim.tracking.tracker import MemoryTracker


def test_shares_split_the_cohort_and_parallel_processes_train_them(tmp_path):
    job = tiny_job(engine={"num_rounds": 2, "cohort_size": 5})
    services, _ = build(job, MemoryTracker(), None, tmp_path)
    store, pool = services.store, services.train_pool
    whole = PlainLoop(job, store, pool)._client_data(1)
    halves = [PlainLoop(job, store, pool, share=(i, 2))._client_data(1) for i in (0, 1)]
    assert [len(h) for h in halves] == [3, 2]
    interleaved = [halves[i % 2][i // 2] for i in range(5)]  # cohort[0::2], cohort[1::2]
    for (x, y), (hx, hy) in zip(whole, interleaved, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)

    parallel = ParallelPlainLoop(job, store, pool, 2)
    try:
        seconds = [parallel.round(r) for r in range(2)]
    finally:
        parallel.close()
    assert all(s > 0 for s in seconds)
    assert all(not p.is_alive() for p in parallel.processes)
