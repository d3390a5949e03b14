"""Backends run a round's cohort on workers. ``SerialBackend`` runs in-process with the same
semantics as ``RayBackend``: the cohort is sharded over the same number of (virtual) workers and
their partials are merged in worker order, so both give bitwise-identical results.

Usage:
    backend = SerialBackend(setup, num_workers=2)
    output = backend.train_cohort(algorithm, payload, cohort, round_num=0)
"""

from __future__ import annotations

import heapq
import time
from typing import Protocol, TypeVar

import numpy as np

from raysim.aggregate import Sum, WeightedMean, merged_result
from raysim.algorithm import AnyAlgorithm
from raysim.config import PersonalizationConfig
from raysim.plugin_defaults import round_aggregator
from raysim.runtime.wire import WorkerReport, WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.services import MapRequest, RoundOptions
from raysim.types import Metrics, NumpyParams, Payload, RoundOutput

A = TypeVar("A")  # the algorithm's aggregate type
R = TypeVar("R")  # one ``map_clients`` result


class Backend(Protocol):
    """Who runs a round's clients, and any per-client evaluation, on the workers."""

    num_workers: int
    is_concurrent: bool  # workers train side by side (a round waits for the slowest), not in turn

    def train_cohort(
        self,
        algorithm: AnyAlgorithm[A],
        payload: Payload,
        cohort: np.ndarray,
        round_num: int,
        options: RoundOptions,
    ) -> RoundOutput[A]: ...

    def map_clients(self, request: MapRequest[R]) -> list[list[R | None]]:
        """``results[point][client position]`` (one "client" for the central set), spread over
        every worker."""
        ...

    def personalize(
        self,
        params: NumpyParams,
        client_ids: np.ndarray,
        config: PersonalizationConfig,
        round_num: int,
        store: str = "",
    ) -> list[Metrics]: ...

    def evaluate_personal(self, params: NumpyParams, client_ids: np.ndarray, round_num: int) -> list[Metrics]:
        """Each client's own predictor (the plugin's ``personal_model``, its state up to
        ``round_num``) on its test split, as rows with ``client_id``."""
        ...

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


def merge_reports(
    algorithm: AnyAlgorithm[A], reports: list[WorkerReport], options: RoundOptions
) -> RoundOutput[A]:
    """Merges the workers' shares of the round (their partials in worker order, canonical), then
    takes the aggregate."""
    start = time.perf_counter()
    aggregator = round_aggregator(algorithm, options.clipping, options.gathers)
    probe_rows: dict[str, list[Metrics]] = {name: [] for name in options.probes}
    for report in reports:
        for name, rows in report.probe_rows.items():
            probe_rows[name] += rows
    for rows in probe_rows.values():
        rows.sort(key=lambda row: row["client_id"])  # independent of the sharding
    aggregate = merged_result(aggregator, [report.aggregate for report in reports])
    peaks = [report.client_peak_bytes for report in reports if report.client_peak_bytes is not None]
    return RoundOutput(
        aggregate=aggregate,
        clients=[client for report in reports for client in report.clients],
        failures=[failure for report in reports for failure in report.failures],
        probe_rows=probe_rows,
        local_models={k: v for report in reports for k, v in report.local_models.items()},
        bytes_up=sum(report.bytes_up for report in reports),
        params_up=sum(report.params_up for report in reports),
        client_peak_bytes=max(peaks, default=None),
        worker_times=[times for report in reports for times in report.worker_times],
        merge_s=time.perf_counter() - start,
    )


def answers_in_segments(algorithm: AnyAlgorithm[A], options: RoundOptions) -> bool:
    """Whether the driver may read a worker's answer in place from memory the worker rewrites in
    its next call (``shared_segments``): the round sums (``WeightedMean``, ``Sum``: their result
    is a new tensor, never a view of a partial) and keeps nothing per client (probes' rows,
    local models) past the merge."""
    aggregator = round_aggregator(algorithm, options.clipping, options.gathers)
    summing = type(aggregator) in (WeightedMean, Sum)
    return summing and not options.probes and not options.keep_local_models


def split_evenly(items: np.ndarray, num_parts: int) -> list[list[int]]:
    """Round-robin split (personalization work)."""
    return [[int(x) for x in items[i::num_parts]] for i in range(num_parts)]


def map_units(request: MapRequest[R]) -> list[tuple[int, int]]:
    """Every (point, client position) pair, grouped by point; (i, i) pairs when ``paired``."""
    if request.paired:
        return [(i, i) for i in range(request.num_clients)]
    return [(p, c) for p in range(len(request.points)) for c in range(request.num_clients)]


def chunk(units: list[tuple[int, int]], num_parts: int) -> list[list[tuple[int, int]]]:
    """Contiguous, near-equal chunks (a worker loads each point of its chunk once)."""
    bounds = np.linspace(0, len(units), num_parts + 1).round().astype(int)
    return [units[bounds[i] : bounds[i + 1]] for i in range(num_parts)]


def by_point(request: MapRequest[R], flat: list[R | None]) -> list[list[R | None]]:
    """The flat results of ``map_units`` order as ``results[point][client position]`` (one row,
    client by client, when ``paired``)."""
    if request.paired:
        return [flat]
    size = request.num_clients
    return [flat[p * size : (p + 1) * size] for p in range(len(request.points))]


class SerialBackend:
    """Trains every shard in this process, one after another, on one resident model."""

    is_concurrent = False  # its virtual workers take turns

    def __init__(self, setup: WorkerSetup, num_workers: int = 1) -> None:
        self.num_workers = num_workers
        self.trainer = ClientTrainer(setup)

    def train_cohort(
        self,
        algorithm: AnyAlgorithm[A],
        payload: Payload,
        cohort: np.ndarray,
        round_num: int,
        options: RoundOptions,
    ) -> RoundOutput[A]:
        sizes = self.trainer.store.num_examples("train")[cohort]
        shards = shard_cohort(cohort, sizes, self.num_workers)
        reports = [self.trainer.train(payload, shard, round_num, options) for shard in shards]
        return merge_reports(algorithm, reports, options)

    def map_clients(self, request: MapRequest[R]) -> list[list[R | None]]:
        return by_point(request, self.trainer.map_units(request, map_units(request)))

    def personalize(
        self,
        params: NumpyParams,
        client_ids: np.ndarray,
        config: PersonalizationConfig,
        round_num: int,
        store: str = "",
    ) -> list[Metrics]:
        return self.trainer.personalize(params, [int(c) for c in client_ids], config, round_num, store)

    def evaluate_personal(self, params: NumpyParams, client_ids: np.ndarray, round_num: int) -> list[Metrics]:
        return self.trainer.evaluate_personal(params, [int(c) for c in client_ids], round_num)

    def shutdown(self) -> None:
        pass
