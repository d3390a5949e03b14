"""``raysim bench``'s vectorized side: each round's cohort trained ``engine.vectorize_chunk``
clients at once (``raysim.train.vectorized``) on one thread (and on the plain loop's device),
beside the plain loop's round of the same cohort one client after another. Both run the same
batches, so the ratio of their round times is the ratio of their times per step.

Usage:
    side = VectorizedSide.for_job(job, store, pool, device)   # None: the plugin or model cannot
    seconds = side.round(round_num, plain.global_state)   # before the plain loop's round
"""

from __future__ import annotations

import time

import numpy as np
import torch

from raysim.algorithm import vectorizes
from raysim.config import JobConfig
from raysim.data.round_data import cap_examples
from raysim.data.store import ClientStore
from raysim.plugin_defaults import local_section
from raysim.runtime.builders import build_algorithm, build_job_model
from raysim.runtime.chunks import ChunkResults, ChunkSize, example_rows
from raysim.runtime.memory import keep_freed_memory
from raysim.sampling import client_seed, sample_cohort
from raysim.train.local import LocalTrainConfig
from raysim.train.vectorizable import vectorization_blocker
from raysim.train.vectorized import train_local_vectorized
from raysim.types import ClientResult


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work, so that a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class VectorizedSide:
    """The vectorized side of the benchmark: one model, trained from the plain loop's weights."""

    def __init__(  # noqa: PLR0913 (the side's five inputs)
        self,
        job: JobConfig,
        store: ClientStore,
        pool: np.ndarray,
        local: LocalTrainConfig,
        device: torch.device,
    ) -> None:
        self.job, self.store, self.pool, self.local, self.device = job, store, pool, local, device
        self.model = build_job_model(job, store.spec).to(device)
        self.chunk_size = ChunkSize.for_worker(job, self.model, device, None)

    @classmethod
    def for_job(
        cls, job: JobConfig, store: ClientStore, pool: np.ndarray, device: torch.device = torch.device("cpu")
    ) -> VectorizedSide | None:
        """The side, when the job's plugin and model vectorize; else None."""
        local = local_section(job.algorithm.config)
        if not isinstance(local, LocalTrainConfig) or not vectorizes(build_algorithm(job)):
            return None
        side = cls(job, store, pool, local, device)
        if vectorization_blocker(side.model, example_rows(store, side.model)) is not None:
            return None
        if device.type == "cpu":
            keep_freed_memory()  # as a vectorizing worker on a CPU does
        return side

    def round(self, round_num: int, weights: dict[str, torch.Tensor]) -> float:
        """Trains the round's cohort in chunks from ``weights``; returns its seconds (data loading
        excluded, as the plain loop's)."""
        job = self.job
        cohort = self.pool[sample_cohort(len(self.pool), job.engine.cohort_size, job.seed, round_num)]
        seeds = [client_seed(job.seed, round_num, int(c)) for c in cohort]
        datas = [
            cap_examples(self.store.client_data(int(c), "train"), job.engine.max_client_examples, seed)
            for c, seed in zip(cohort, seeds, strict=True)
        ]
        self.model.load_state_dict(weights)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the plain loop's one thread

        def train_chunk(ids: list[int]) -> list[ClientResult]:
            picked = [datas[i] for i in ids]
            seeds_of = [seeds[i] for i in ids]
            train_local_vectorized(
                self.model,
                picked,
                self.local,
                seeds=seeds_of,
                spec=self.store.spec,
                round_num=round_num,
                device=self.device,
            )
            return [ClientResult({}, 1.0, {}) for _ in ids]

        synchronize(self.device)
        t0 = time.perf_counter()
        chunks = ChunkResults(train_chunk, range(len(datas)), self.chunk_size)  # sized as a worker's
        for i in range(len(datas)):
            chunks.result(i)
        synchronize(self.device)
        seconds = time.perf_counter() - t0
        torch.set_num_threads(threads)
        return seconds
