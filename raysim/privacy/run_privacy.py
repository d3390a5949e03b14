"""A run's privacy as the engine uses it: central DP's ledger and the clients' counts, one value.

The engine asks it five things a round: the clip bound the workers need (``clipping``), the round's
aggregate released from the merged sums and the trained clients counted (``release``), the
``privacy/*`` metrics, what a checkpoint keeps (``state``), and, at build, how many rounds a budget
allows. Either part may be absent: a job with only local DP or DP-SGD has no ledger, one with only
central DP no client counts.

Usage:
    privacy = RunPrivacy(ledger, clients)
    options = replace(options, clipping=privacy.clipping())
    output = privacy.release(aggregator_of(algorithm), output, round_num)
    save_checkpoint(..., privacy=privacy.state())
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

from raysim.aggregate import Aggregator
from raysim.errors import CheckpointError
from raysim.privacy.client_counts import ClientCounts
from raysim.privacy.ledger import PrivacyLedger
from raysim.private_sums import ClientClipping
from raysim.stored import plain
from raysim.types import Metrics, RoundOutput

A = TypeVar("A")


@dataclass
class RunPrivacy:
    """Central DP's ledger (None without ``privacy.central``) and the clients' counts (None without
    local DP or DP-SGD)."""

    ledger: PrivacyLedger | None
    clients: ClientCounts | None

    @property
    def rounds_allowed(self) -> int | None:
        """The rounds a budget allows where fewer than the job's (``when_reached: stop``)."""
        return self.ledger.rounds_allowed if self.ledger is not None else None

    def clipping(self) -> ClientClipping | None:
        """What the workers clip to this round (None: no central DP)."""
        return self.ledger.clipping() if self.ledger is not None else None

    def release(self, aggregator: Aggregator[Any], output: RoundOutput[A], round_num: int) -> RoundOutput[A]:
        """The trained cohort with its aggregate released (central DP: noised, over the fixed
        denominator) and its clients counted (local DP's reports, DP-SGD's steps)."""
        if self.ledger is not None:
            output = replace(output, aggregate=self.ledger.release(aggregator, output.aggregate, round_num))
        if self.clients is not None:
            self.clients.record(output.clients)
        return output

    def metrics(self) -> Metrics:
        """``privacy/*``: the epsilon spent so far, centrally and by the worst client."""
        central = self.ledger.metrics() if self.ledger is not None else {}
        return central | (self.clients.metrics() if self.clients is not None else {})

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: each present part's state as plain values."""
        central = {"central": plain(self.ledger.state)} if self.ledger is not None else {}
        return central | ({"clients": self.clients.state()} if self.clients is not None else {})

    def restore(self, saved: object, path: str) -> None:
        """A resumed run goes on from its checkpoint's state, which must hold what this job keeps.

        Raises:
            CheckpointError: the checkpoint was written without privacy, or without a part this
                job has (its run had other privacy settings).
        """
        if saved is None:
            raise CheckpointError(
                f"{path}: was written by a run without privacy, which a private run cannot continue "
                f"(its rounds spent nothing the accountant knows of): drop --resume, or privacy:"
            )
        if not isinstance(saved, dict):
            raise CheckpointError(
                f"{path}: its privacy state is unreadable (a {type(saved).__name__}, not the mapping a "
                f"run writes); resume from an earlier checkpoint of the run"
            )
        for name, part in (("central", self.ledger), ("clients", self.clients)):
            if part is None:
                continue
            if name not in saved:
                raise CheckpointError(
                    f"{path}: holds no {name} privacy state, so its run had other privacy settings: "
                    f"resume with that run's privacy: section, or drop --resume"
                )
            part.restore(saved[name], path)
