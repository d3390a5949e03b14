"""RayBackend: long-lived worker actors, one broadcast per round, one partial each (through shared
memory for the workers on the driver's node, ``shared_segments.py``, their calls over direct
lines, ``direct_line.py``; the object store and Ray's calls beyond).

Workers are ``ClientTrainer`` actors reserved together in a placement group (a job never starts
with half a pool), spread over a cluster's nodes by ``resources.placement``. Each opens the job's
stores at the driver's paths where its node holds them, else a copy shipped through the object
store (``shipping.py``, ``resources.ship_data``). A worker that dies is restarted by Ray up to
``max_worker_restarts`` times and its call retried; a worker that stays dead (or whose node is
gone and whose reservation no other node can hold for ``restart_timeout_s``) leaves the pool,
its clients are re-run on the others, and the run log says so.

Ray itself is started (or joined) by ``ray_session.init_ray``; the pool's size comes from
``ray_placement``.

Usage:
    backend = RayBackend(setup, ResourcesConfig(num_workers=2), num_examples)
    output = backend.train_cohort(algorithm, payload, cohort, round_num=0)
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, TypeVar

import numpy as np
import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from raysim.algorithm import AnyAlgorithm
from raysim.config import PersonalizationConfig, ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime.backend import (
    answers_in_segments,
    by_point,
    chunk,
    map_units,
    merge_reports,
    shard_cohort,
    split_evenly,
)
from raysim.runtime.direct_line import LineAddress, LineLost, Lines, OnLine
from raysim.runtime.ray_placement import (
    driver_threads,
    placeable_workers,
    resolve_num_workers,
    worker_setup_for,
)
from raysim.runtime.ray_session import init_ray, ray_result
from raysim.runtime.ray_workers import (
    ClusterTrainer,
    ShardCall,
    WorkerPlace,
    view_of_this_node,
)
from raysim.runtime.shared_segments import DriverSegments, Packed
from raysim.runtime.shipping import DataPlan, stores_to_ship
from raysim.runtime.wire import WorkerReport, WorkerSetup
from raysim.services import MapRequest, RoundOptions
from raysim.types import Metrics, NumpyParams, Payload, RoundOutput

log = logging.getLogger("raysim")
_PLACEMENT_TIMEOUT_S = 120
_POLL_S = 1.0  # how often a pending call checks that its worker still has a node
# A ClientTrainer actor. Ray's stubs type only @ray.method methods of an ActorHandle with .remote,
# and ClientTrainer stays plain Python (Ray at the edges), so its handles are untyped.
WorkerHandle = Any
A = TypeVar("A")  # the algorithm's aggregate type
R = TypeVar("R")  # one ``map_clients`` result
# a shard's ``train`` arguments: its (position, client) pairs, round, options, its clients' parts
Call: TypeAlias = tuple[list[tuple[int, int]], int, RoundOptions, dict[int, Any] | None]


class RayBackend:
    """Trains each round's cohort on a pool of ``ClientTrainer`` actors."""

    is_concurrent = True

    def __init__(self, setup: WorkerSetup, resources: ResourcesConfig, num_examples: np.ndarray) -> None:
        init_ray(resources)
        self.num_examples = num_examples
        self.restart_timeout_s = resources.restart_timeout_s
        self.num_workers = placeable_workers(resources, resolve_num_workers(resources))
        bundle = {"CPU": resources.cpus_per_worker}
        if resources.gpu_share > 0:
            bundle["GPU"] = resources.gpu_share
        self.placement = placement_group([bundle] * self.num_workers, strategy=resources.placement)
        try:
            ray.get(self.placement.ready(), timeout=_PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            remove_placement_group(self.placement)
            raise ResourceError(
                f"could not reserve {self.num_workers} x {bundle} within "
                f"{_PLACEMENT_TIMEOUT_S} s: {ray.available_resources()} available"
            ) from None
        # Held for the run: a worker Ray restarts reads the shipped files again (ray-project/ray#53727).
        try:
            self.plan = self._data_plan(setup, resources)
        except BaseException:  # a node that cannot read the data: no reservation left behind
            remove_placement_group(self.placement)
            raise
        actor = ray.remote(ClusterTrainer)
        one = worker_setup_for(setup, resources)
        self.workers: list[WorkerHandle] = [
            actor.options(
                num_cpus=resources.cpus_per_worker,
                num_gpus=resources.gpu_share,
                max_restarts=resources.max_worker_restarts,
                max_task_retries=resources.max_worker_restarts,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.placement, placement_group_bundle_index=i
                ),
            ).remote(one, self.plan)
            for i in range(self.num_workers)
        ]
        self.bundle_of = {worker: i for i, worker in enumerate(self.workers)}
        self.dead_workers = 0
        self.places: list[WorkerPlace] = _get([w.where.remote() for w in self.workers])  # errors now
        nodes = {place.node_id for place in self.places}
        if len(nodes) > 1:
            log.info("%d workers on %d nodes", len(self.workers), len(nodes))
        self.segments = DriverSegments()
        self.local = self._mapping_workers()
        self.lines = Lines()
        self._open_lines(self.workers)
        self.threads_before = torch.get_num_threads()  # the driver's, given back at shutdown
        here = sum(place.node_id == ray.get_runtime_context().get_node_id() for place in self.places)
        torch.set_num_threads(driver_threads(self.threads_before, here * resources.cpus_per_worker))

    def _mapping_workers(self) -> set[int]:
        """The bundles of the workers on the driver's node that map its segments: their rounds
        go through shared memory (``shared_segments``), the others' through the object store."""
        driver = ray.get_runtime_context().get_node_id()
        here = [w for w, place in zip(self.workers, self.places) if place.node_id == driver]
        if not here:  # a driver beside the cluster: no segment, no sentinel
            return set()
        maps = _get([w.maps.remote(self.segments.broadcast.name) for w in here])
        return {self.bundle_of[w] for w, ok in zip(here, maps) if ok}

    def _open_lines(self, workers: list[WorkerHandle]) -> None:
        """Direct lines to those of ``workers`` whose rounds go through this node's segments."""
        here = [w for w in workers if self.bundle_of[w] in self.local]
        for worker, address in zip(here, _get([w.open_line.remote() for w in here])):
            self._open_line(worker, address)

    def _open_line(self, worker: WorkerHandle, address: LineAddress | None) -> None:
        if not self.lines.open(self.bundle_of[worker], address, ray.cloudpickle.dumps):
            log.info("no direct line to a worker on this node: its rounds go through Ray's calls")

    def _reopen_line(self, worker: WorkerHandle) -> None:
        """A new line to a worker whose line broke, once it answered through Ray (restarted)."""
        try:
            self._open_line(worker, ray_result(worker.open_line.remote()))
        except RayError as exc:  # it died again since answering, say: the next round finds out
            log.info("no new direct line to a worker (%s): its rounds go through Ray's calls", exc)

    def _data_plan(self, setup: WorkerSetup, resources: ResourcesConfig) -> DataPlan:
        """The stores' fingerprints, and shipped copies of those some worker's node cannot read
        (``resources.ship_data``). Each node other than the driver's is asked once, by a task."""
        plan = DataPlan.of(setup, resources.ship_data)
        driver = ray.get_runtime_context().get_node_id()
        nodes = set(placement_group_table(self.placement)["bundles_to_node_id"].values()) - {driver}
        probe = ray.remote(num_cpus=0)(view_of_this_node)
        on = [NodeAffinitySchedulingStrategy(node, soft=False) for node in sorted(nodes)]
        views: list[Any] = _get([probe.options(scheduling_strategy=s).remote(plan) for s in on])
        shipped = stores_to_ship(plan, views)
        if shipped:
            log.info("shipping %s through the object store", ", ".join(plan.stores[n].path for n in shipped))
        return plan.ship(shipped, ray.put)

    def train_cohort(
        self,
        algorithm: AnyAlgorithm[A],
        payload: Payload,
        cohort: np.ndarray,
        round_num: int,
        options: RoundOptions,
    ) -> RoundOutput[A]:
        # a call on a line left by a round that raised ends before the broadcast is rewritten (a
        # Ray call left so is not waited for: the engine ends a run whose round raised)
        self.lines.settle()
        # ONE copy of the shared part for every worker (a segment for those on this node, the
        # object store for the others); each client's own part goes to the worker that trains it
        shared = replace(payload, per_client={})
        here = {self.bundle_of[w] for w in self.workers} & self.local
        packed = self._send(shared) if here else None
        beyond = any(self.bundle_of[w] not in self.local for w in self.workers)
        broadcast = Broadcast(packed, ray.put(shared) if beyond else None)
        shards = shard_cohort(cohort, self.num_examples[cohort], len(self.workers))
        answers = answers_in_segments(algorithm, options)
        reports = self._run_shards(broadcast, payload.per_client, shards, round_num, options, answers)
        del broadcast
        return merge_reports(algorithm, reports, options)

    def _send(self, shared: Payload) -> Packed | None:
        """The broadcast packed in the driver's segment; None, and the object store for every
        worker from then on, where /dev/shm cannot hold it."""
        try:
            return self.segments.send(shared, ray.cloudpickle.dumps)
        except OSError as exc:
            log.warning("/dev/shm cannot hold the broadcast (%s): rounds go through Ray's object store", exc)
            self.local = set()
            return None

    def _train(self, worker: WorkerHandle, broadcast: Broadcast, call: Call, answer: bool) -> Any:
        """One worker's call: through shared memory on this node (its answer into its segment
        where ``answer``), over its direct line where it has one; else through the object store."""
        bundle = self.bundle_of[worker]
        if bundle not in self.local:
            return worker.train.remote(broadcast.ref, *call)
        assert broadcast.packed is not None, "a round with a worker on this node packs its broadcast"
        segment = self.segments.answer_segment(bundle) if answer else None
        shard_call = ShardCall(broadcast.packed, *call, segment)
        if self.lines.send(bundle, shard_call):
            return OnLine(shard_call)
        return worker.train_here.remote(shard_call)

    def _run_shards(
        self,
        broadcast: Broadcast,
        per_client: dict[int, Any],
        shards: list[list[tuple[int, int]]],
        round_num: int,
        options: RoundOptions,
        answers: bool,
    ) -> list[WorkerReport]:
        """Runs the shards; clients of workers that died for good are re-sharded over the rest.

        A lost worker (or node) leaves the round's result as it was, to float rounding (~1e-6):
        a client's data subset, shuffling and torch randomness come from (seed, round, client)
        (``client_seed``), whichever worker trains it and whenever, and client state lives
        outside the workers; the re-run clients only fold into other partials, and partials are
        float64 sums under an associative aggregator, merged in a fixed order (the survivors in
        worker order, then the re-run shards), so only the order of float64 additions changes.
        A re-run answers whole: a survivor's first answer may still lie in its segment, unmerged.
        """
        reports: list[WorkerReport] = []
        pending = list(zip(self.workers, shards))
        while pending:
            calls = [(w, (s, round_num, options, parts_of(per_client, s))) for w, s in pending if s]
            refs = [(w, call[0], self._train(w, broadcast, call, answers)) for w, call in calls]
            answers = False
            orphans: list[tuple[int, int]] = []
            for worker, shard, ref in refs:
                try:
                    reports.append(self.segments.received(self.bundle_of[worker], self._answer(worker, ref)))
                except RayActorError:
                    self._drop(worker, f"round {round_num}")
                    orphans += shard
            pending = list(zip(self.workers, self._reshard(orphans))) if orphans else []
        return reports

    def _answer(self, worker: WorkerHandle, sent: Any) -> Any:
        """A round's answer: read from the worker's line, else ``_await``'s. Where the line broke
        (the worker's process died) the same call goes through Ray, which answers as it would have
        (the worker it restarted, or ``RayActorError``); then a new line to that worker."""
        bundle = self.bundle_of[worker]
        if isinstance(sent, OnLine):
            try:
                return self.lines.receive(bundle)
            except LineLost as lost:
                log.info("a worker's direct line broke (%s): its call goes through Ray", lost)
                sent = worker.train_here.remote(sent.call)
        answer = self._await(worker, sent)
        if bundle in self.lines.broken:  # broke here, or on sending the call
            self._reopen_line(worker)
        return answer

    def _await(self, worker: WorkerHandle, ref: Any) -> Any:
        """The call's result. A worker whose node is gone waits for Ray to place it on another
        node; when none holds it for ``restart_timeout_s`` (Ray would wait forever) it is killed,
        and its call fails like any lost worker's.

        Raises:
            RayActorError: the worker died for good.
        """
        lost_since: float | None = None
        while not ray.wait([ref], timeout=_POLL_S)[0]:
            if self._has_node(worker):
                lost_since = None
                continue
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > self.restart_timeout_s:
                log.warning("a worker lost its node; none took it in %g s", self.restart_timeout_s)
                ray.kill(worker, no_restart=True)
                break
        return ray_result(ref)

    def _has_node(self, worker: WorkerHandle) -> bool:
        """Whether the worker's reservation is on a live node (Ray re-places it after a node loss)."""
        return bool(placement_group_table(self.placement)["bundles_to_node_id"].get(self.bundle_of[worker]))

    def _drop(self, dead: WorkerHandle, during: str) -> None:
        """A worker Ray could not restart leaves the pool, and the log says so."""
        if dead in self.workers:
            self.workers.remove(dead)
            self.local.discard(self.bundle_of[dead])
            self.lines.close(self.bundle_of[dead])
            self.lines.broken.discard(self.bundle_of[dead])
            self.dead_workers += 1
        log.warning("%s: a worker died for good (%d left); re-running its work", during, len(self.workers))
        if not self.workers:
            raise ResourceError("every worker died; see the Ray logs (ray/session_latest/logs)")

    def _reshard(self, orphans: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        positions = np.array([p for p, _ in sorted(orphans)])
        clients = np.array([c for _, c in sorted(orphans)])
        shards = shard_cohort(clients, self.num_examples[clients], len(self.workers))
        return [[(int(positions[i]), c) for i, c in shard] for shard in shards]  # cohort positions

    def map_clients(self, request: MapRequest[R]) -> list[list[R | None]]:
        request_ref = ray.put(request)  # one copy of every point for all workers
        parts = [part for part in chunk(map_units(request), len(self.workers)) if part]
        results = self._spread(lambda w, part: w.map_units.remote(request_ref, part), parts, "map_clients")
        return by_point(request, [result for part in results for result in part])

    def personalize(
        self,
        params: NumpyParams,
        client_ids: np.ndarray,
        config: PersonalizationConfig,
        round_num: int,
        store: str = "",
    ) -> list[Metrics]:
        return self._per_client("personalize", params, client_ids, config, round_num, store)

    def evaluate_personal(self, params: NumpyParams, client_ids: np.ndarray, round_num: int) -> list[Metrics]:
        return self._per_client("evaluate_personal", params, client_ids, round_num)

    def _per_client(
        self, method: str, params: NumpyParams, client_ids: np.ndarray, *args: Any
    ) -> list[Metrics]:
        """Spreads per-client evaluation work over the workers; results sorted by client."""
        params_ref = ray.put(params)
        parts = [part for part in split_evenly(client_ids, len(self.workers)) if part]
        results = self._spread(
            lambda w, part: getattr(w, method).remote(params_ref, part, *args), parts, method
        )
        return sorted((m for part in results for m in part), key=lambda m: m["client_id"])

    def _spread(self, call: Callable[[WorkerHandle, Any], Any], parts: list[Any], during: str) -> list[Any]:
        """Runs ``call`` on one part per worker; a part whose worker died for good runs again on a
        survivor (evaluation, like training, outlives a lost worker). Results in part order."""
        self.lines.settle()  # a worker runs one call at a time
        results: dict[int, Any] = {}
        pending = list(range(len(parts)))
        while pending:
            running = [(i, w, call(w, parts[i])) for i, w in zip(pending, itertools.cycle(self.workers))]
            pending = []
            for i, worker, ref in running:
                try:
                    results[i] = self._await(worker, ref)
                except RayActorError:
                    self._drop(worker, during)
                    pending.append(i)
        return [results[i] for i in range(len(parts))]

    def shutdown(self) -> None:
        torch.set_num_threads(self.threads_before)
        self.lines.close()
        self.segments.close()
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        remove_placement_group(self.placement)
        self.plan = replace(self.plan, stores={})  # frees the shipped files in the object store


@dataclass(frozen=True)
class Broadcast:
    """A round's shared payload: packed in the driver's segment (None: no worker on its node),
    and in the object store (None: every worker on its node)."""

    packed: Packed | None
    ref: Any


def parts_of(per_client: dict[int, Any], shard: list[tuple[int, int]]) -> dict[int, Any] | None:
    """The payload parts of the shard's clients (None: the plugin sends none)."""
    return {c: per_client[c] for _, c in shard if c in per_client} if per_client else None


def _get(refs: Any) -> Any:
    """``ray_result`` while workers start: a worker whose constructor raised is a ResourceError."""
    try:
        return ray_result(refs)
    except RayActorError as exc:
        if "__init__" in str(exc):  # the constructor raised: say so, keep Ray's report
            raise ResourceError(f"a worker failed to start: {exc}") from exc
        raise
