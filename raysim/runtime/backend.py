"""Backends run a round's cohort on workers. ``SerialBackend`` runs in-process with the same
semantics as ``RayBackend``: the cohort is sharded over the same number of (virtual) workers and
their partials are merged in worker order, so both give bitwise-identical results.

Usage:
    backend = SerialBackend(setup, num_workers=2)
    output = backend.train_cohort(algorithm, payload, cohort, round_num=0)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from raysim.runtime.worker import ClientFailure, ClientTrainer, WorkerReport, WorkerSetup
from raysim.types import Metrics, NumpyParams, Payload


@dataclass
class RoundOutput:
    """A round's merged partial plus what the engine reports about it."""

    aggregate: Any  # the aggregator's result(merged partials)
    client_metrics: list[Metrics] = field(default_factory=list)
    failures: list[ClientFailure] = field(default_factory=list)
    barrier: list[Metrics] = field(default_factory=list)
    bytes_up: int = 0
    worker_seconds: list[float] = field(default_factory=list)


class Backend(Protocol):
    num_workers: int

    def train_cohort(
        self,
        algorithm: Any,
        payload: Payload,
        cohort: np.ndarray,
        round_num: int,
        measure_barrier: bool = False,
    ) -> RoundOutput: ...

    def evaluate_clients(
        self,
        params: NumpyParams,
        client_ids: np.ndarray,
        split: str = "test",
        round_num: int | None = None,
        store: str = "",
    ) -> list[Metrics]: ...

    def personalize(
        self, params: NumpyParams, client_ids: np.ndarray, config: Any, round_num: int, store: str = ""
    ) -> list[Metrics]: ...

    def evaluate_central(self, params: NumpyParams) -> Metrics | None: ...

    def shutdown(self) -> None: ...


def shard_cohort(
    cohort: np.ndarray, num_examples: np.ndarray, num_workers: int
) -> list[list[tuple[int, int]]]:
    """Assigns clients to workers, largest first to the least-loaded worker (LPT).

    Ties break by worker index, so the assignment is a pure function of its inputs. Each shard
    lists (cohort position, client id) in cohort order.
    """
    loads = [(0, w) for w in range(num_workers)]
    shards: list[list[tuple[int, int]]] = [[] for _ in range(num_workers)]
    order = sorted(range(len(cohort)), key=lambda i: (-int(num_examples[i]), i))
    for position in order:
        load, worker = heapq.heappop(loads)
        shards[worker].append((position, int(cohort[position])))
        heapq.heappush(loads, (load + max(int(num_examples[position]), 1), worker))
    return [sorted(shard) for shard in shards]


def merge_reports(algorithm: Any, reports: list[WorkerReport]) -> RoundOutput:
    """Merges worker partials in worker order (canonical), then takes the aggregate."""
    aggregator = algorithm.aggregator()
    merged = aggregator.zero()
    output = RoundOutput(aggregate=None)
    for report in reports:
        merged = aggregator.merge(merged, report.partial)
        output.client_metrics += report.client_metrics
        output.failures += report.failures
        output.barrier += report.barrier
        output.bytes_up += report.bytes_up
        output.worker_seconds.append(report.seconds)
    output.aggregate = aggregator.result(merged)
    return output


def split_evenly(items: np.ndarray, num_parts: int) -> list[list[int]]:
    """Round-robin split (evaluation work)."""
    return [[int(x) for x in items[i::num_parts]] for i in range(num_parts)]


class SerialBackend:
    """Trains every shard in this process, one after another, on one resident model."""

    def __init__(self, setup: WorkerSetup, num_workers: int = 1) -> None:
        self.num_workers = num_workers
        self.trainer = ClientTrainer(setup)

    def train_cohort(
        self,
        algorithm: Any,
        payload: Payload,
        cohort: np.ndarray,
        round_num: int,
        measure_barrier: bool = False,
    ) -> RoundOutput:
        sizes = self.trainer.store.num_examples("train")[cohort]
        shards = shard_cohort(cohort, sizes, self.num_workers)
        reports = [self.trainer.train(payload, shard, round_num, measure_barrier) for shard in shards]
        return merge_reports(algorithm, reports)

    def evaluate_clients(
        self,
        params: NumpyParams,
        client_ids: np.ndarray,
        split: str = "test",
        round_num: int | None = None,
        store: str = "",
    ) -> list[Metrics]:
        return self.trainer.evaluate_clients(params, [int(c) for c in client_ids], split, round_num, store)

    def personalize(
        self, params: NumpyParams, client_ids: np.ndarray, config: Any, round_num: int, store: str = ""
    ) -> list[Metrics]:
        return self.trainer.personalize(params, [int(c) for c in client_ids], config, round_num, store)

    def evaluate_central(self, params: NumpyParams) -> Metrics | None:
        return self.trainer.evaluate_central(params)

    def shutdown(self) -> None:
        pass
