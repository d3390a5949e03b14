"""What runs inside Ray's processes: the ``ClusterTrainer`` actor and the tasks that look at a
node; ``ray_backend.py`` is the driver's side, which starts them and calls them.

A ``ClusterTrainer`` on the driver's own node takes its round through shared memory
(``train_here``, ``raysim.runtime.shared_segments``): the broadcast read from the driver's
segment, its answer written into a segment of its own where the driver offers one; and the call
itself over a direct line where it can open one (``open_line``, ``raysim.runtime.direct_line``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial, wraps
from typing import Any, TypeVar

import ray
import torch

from raysim.runtime.direct_line import LineAddress, LineServer
from raysim.runtime.gpu_sizing import ProbeWork, WorkerPeak, measure_worker
from raysim.runtime.shared_segments import Attached, Packed, Unfit, carved, pack, unpack
from raysim.runtime.shipping import DataPlan, NodeView, node_view
from raysim.runtime.wire import WorkerReport, WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.services import RoundOptions

F = TypeVar("F", bound=Callable[..., Any])


def one_at_a_time(method: F) -> F:
    """A call that uses the worker's resident model, run under the worker's lock: a round on the
    direct line's thread and a Ray call on the main thread never overlap, whatever the driver's
    bookkeeping (an interrupt on the driver can leave a call running that it no longer waits for)."""

    @wraps(method)
    def locked(self: ClusterTrainer, *args: Any, **kwargs: Any) -> Any:
        with self.busy:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


def node_label() -> str:
    """This process's node, for messages: host name, address and Ray node id."""
    node_id = ray.get_runtime_context().get_node_id()
    return f"{socket.gethostname()} ({ray.util.get_node_ip_address()}, Ray node {node_id[:8]})"


@dataclass(frozen=True)
class WorkerPlace:
    """Where a worker runs and which copy of the training store it opened."""

    node_id: str
    node: str
    store_path: str


class ClusterTrainer(ClientTrainer):
    """A ``ClientTrainer`` on whichever node Ray placed it: it opens the stores that node holds at
    the driver's paths, or their shipped copies, and keeps client state only in the driver's
    state directory (``shipping.DataPlan``). A worker Ray restarts on another node decides afresh.
    """

    def __init__(self, setup: WorkerSetup, plan: DataPlan) -> None:
        self.busy = threading.RLock()  # reentrant: ``train_here`` calls ``train``
        node = node_label()
        super().__init__(plan.resolve(setup, ray.get, node))
        self.states = plan.state_store(node)
        self.place = WorkerPlace(ray.get_runtime_context().get_node_id(), node, str(self.store.path))
        self.segments = Attached()
        self.answer: str | None = None  # the last answer segment offered: kept mapped between offers
        self.line: LineServer | None = None

    train = one_at_a_time(ClientTrainer.train)
    personalize = one_at_a_time(ClientTrainer.personalize)
    evaluate_personal = one_at_a_time(ClientTrainer.evaluate_personal)
    map_units = one_at_a_time(ClientTrainer.map_units)

    def where(self) -> WorkerPlace:
        return self.place

    def maps(self, segment: str) -> bool:
        """Whether this process can map the driver's ``segment`` (it shares the driver's memory)."""
        try:
            self.segments.buffer(segment)
        except OSError:
            return False
        return True

    def open_line(self) -> LineAddress | None:
        """The address and key of this worker's direct line for ``train_here``, opened at the
        first ask; None where this platform has none, or where the worker vectorizes on a CPU
        (the rounds stay on Ray's path, on the main thread)."""
        if on_main_thread_only(self.vectorizes, self.device):
            return None
        if self.line is None:
            try:
                self.line = LineServer(self.train_here, ray.cloudpickle.dumps)
            except OSError:
                return None
        return self.line.address

    @one_at_a_time
    def train_here(self, call: ShardCall) -> WorkerReport | Packed | Unfit:
        """``train`` with the payload read from the driver's segment (copied: the next round's
        broadcast rewrites it), and the report written into the ``answer`` segment where the
        driver offers one, its partial's sums folded there from the first client on; a report
        that does not fit goes back whole, with the size it needs."""
        broadcast, answer = call.broadcast, call.answer
        payload = unpack(self.segments.buffer(broadcast.segment), broadcast, copy=True)
        memory = partial(carved, self.segments.buffer(answer)) if answer is not None else None
        report = self.train(payload, call.tasks, call.round_num, call.options, call.per_client, memory)
        self.answer = answer or self.answer
        self.segments.keep_only({broadcast.segment} | ({self.answer} if self.answer else set()))
        if answer is None:
            return report
        return pack(self.segments.buffer(answer), answer, report, ray.cloudpickle.dumps)


@dataclass(frozen=True)
class ShardCall:
    """A worker's part of a round through shared memory, as one argument: Ray serializes each
    argument of a call apart, and one costs about half of six to send."""

    broadcast: Packed  # the round's payload, in the driver's segment
    tasks: list[tuple[int, int]]  # (cohort position, client id)
    round_num: int
    options: RoundOptions
    per_client: dict[int, Any] | None  # these clients' own payload parts
    answer: str | None  # the segment to answer in; None: answer whole, through Ray


def view_of_this_node(plan: DataPlan) -> NodeView:
    return node_view(plan, node_label())


def gpu_node_view(plan: DataPlan) -> tuple[str, NodeView]:
    return ray.get_runtime_context().get_node_id(), view_of_this_node(plan)


def measure_here(setup: WorkerSetup, plan: DataPlan, work: ProbeWork) -> WorkerPeak:
    return measure_worker(plan.resolve(setup, ray.get, node_label()), work)


def on_main_thread_only(vectorizes: bool, device: torch.device) -> bool:
    """Whether a worker's rounds must run on its process's main thread, as Ray runs them, and not
    on a direct line's: a chunk trained on a CPU allocates tensors of tens of MB each step.
    ``keep_freed_memory`` keeps those pages for the next step in glibc's main arena only; a
    thread of its own allocates from another arena, which maps and unmaps them, so every step
    faults them in again (measured: 95 MB faulted on each reuse on a thread, none on the main
    thread)."""
    return vectorizes and device.type == "cpu"
