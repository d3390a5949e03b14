"""What a worker reads back from its device about a client: is the update finite, and its metrics.

On a CPU a read costs nothing and each client's update is checked at once. On a GPU a read waits
for every kernel queued before it, so reading once per client would leave the card idle while
the worker prepares the next client. There ``RoundChecks`` queues each client's finiteness flag
on the card and reads the round's flags, and ``read_clients`` the round's metrics, back at once.

A check can be queued only while nothing of the round has been kept: a client that returns state
(kept at once) settles the queued flags first and ends queueing for the round. In the rare round
whose queued flags say some update is not finite, the worker trains the round again checking
each client at once (``RetrainRound``); its clients' results are pure functions of the seed, the
round and the client, so the second pass finds the same clients and names their tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from raysim import params as P
from raysim.errors import NonFiniteError
from raysim.types import ClientResult, TrainedClient


def defers_reads(device: torch.device) -> bool:
    """Whether a worker on ``device`` reads its clients back once per round: on a GPU."""
    return device.type == "cuda"


class RetrainRound(Exception):
    """A queued check found an update that is not finite: train the round checking each client."""


class RoundChecks:
    """One worker round's finiteness checks: at once, or queued (``defer``) until ``settle``."""

    def __init__(self, defer: bool) -> None:
        self.defer = defer
        self._flags: list[torch.Tensor] = []

    def check(self, result: ClientResult) -> None:
        """Checks ``result`` now, or queues its check while nothing of the round is kept.

        Raises:
            NonFiniteError: ``result`` checked now is not finite.
            RetrainRound: a queued check, settled now, found an update that is not finite.
        """
        if self.defer and result.state is None and isinstance(result.weight, (int, float)):
            if not math.isfinite(result.weight):
                raise RetrainRound
            flag = P.finite_flag(result.update)
            if flag is not None:
                self._flags.append(flag)
            return
        self.settle()
        self.defer = False  # its state is kept next: no client before it may be trained again
        check_finite_result(result)

    def settle(self) -> None:
        """Reads the queued flags back, in one read.

        Raises:
            RetrainRound: one of them says an update is not finite.
        """
        flags, self._flags = self._flags, []
        if flags and not bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
            raise RetrainRound


def check_finite_result(result: ClientResult) -> None:
    """Refuses a client result whose update or weight holds NaN or infinity.

    One diverging client (a huge learning rate) would otherwise turn the whole aggregate, and so
    the global model, into NaN. The check is one reduction per tensor and one read per client.

    Raises:
        NonFiniteError: naming the tensors that are not finite.
    """
    weight_is_finite = math.isfinite(float(result.weight))
    if weight_is_finite and P.is_finite(result.update):
        return
    bad = P.nonfinite_names(result.update) + ([] if weight_is_finite else ["weight"])
    raise NonFiniteError(
        f"the client's update holds NaN or infinity in {bad[:5]}{' ...' if len(bad) > 5 else ''}; "
        f"its local training diverged (lower the learning rate, or set local.grad_clip), or the "
        f"global model it started from already overflowed (a server step too large: "
        f"algorithm.server.lr)"
    )


@dataclass(frozen=True)
class UnreadClient:
    """A trained client as the worker records it, its weight and metrics maybe still tensors on
    the device (``read_clients`` reads the round's back at once)."""

    client_id: int
    weight: float | torch.Tensor
    seconds: float
    metrics: Mapping[str, float | torch.Tensor]


def read_clients(clients: list[UnreadClient]) -> list[TrainedClient]:
    """The clients with every tensor of their weights and metrics read back as a float, all of
    them in one read."""
    values = iter(read_floats([v for c in clients for v in (c.weight, *c.metrics.values())]))
    return [
        TrainedClient(c.client_id, next(values), c.seconds, {k: next(values) for k in c.metrics})
        for c in clients
    ]


def read_floats(values: list[float | torch.Tensor]) -> list[float]:
    """``values`` as floats, every tensor (one value each) read back in one read."""
    tensors = [v.detach().reshape(()) for v in values if isinstance(v, torch.Tensor)]
    read = iter(
        torch.stack([t.to(tensors[0].device, torch.float64) for t in tensors]).tolist() if tensors else []
    )
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]
