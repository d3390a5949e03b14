"""What the clients have spent under local DP and DP-SGD: each client's reports and noised steps,
and the most epsilon any client has spent so far (docs/privacy.md).

A client's guarantee is its own: local DP composes over the rounds it reported in, DP-SGD over the
noised gradient steps it took, at the rates it took them (``raysim.privacy.per_client``). The
engine records each trained client after its round; the logged figure is the worst client's, the
one a guarantee must quote. DP-SGD's counts are the trainer's own, read from each client's metrics
(``raysim.train.dp_sgd.sample_counts``): the examples it drew its batches from this round (after
``engine.max_client_examples`` and the validation split), the expected batch and the noised
steps. The counts are part of every checkpoint (``ClientCountsState``), so a resumed run goes on
counting.

Usage:
    clients = ClientCounts(job.privacy, plugin=job.algorithm.name)
    clients.record(output.clients)
    clients.metrics()  # privacy/local/epsilon, privacy/sample/epsilon
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from raysim.config.privacy import PrivacyConfig
from raysim.errors import CheckpointError, ConfigError
from raysim.privacy.per_client import SampledSteps, local_epsilon, sample_epsilon
from raysim.stored import plain, rebuild
from raysim.train.dp_sgd import BATCH_METRIC, EXAMPLES_METRIC, STEPS_METRIC
from raysim.types import Metrics, TrainedClient

Steps = tuple[tuple[int, int, int], ...]  # (examples, batch size, noised steps), one per rate


@dataclass(frozen=True)
class ClientCountsState:
    """What a checkpoint keeps of the clients' spending (plain values: ``stored.plain``).

    Attributes:
        reports: client id -> the updates it released (local DP's count).
        sampled: client id -> its DP-SGD steps, one ``(examples, batch size, steps)`` per rate.
        worst_sample: the most epsilon any client's DP-SGD has spent.
    """

    reports: dict[int, int]
    sampled: dict[int, Steps]
    worst_sample: float
    accounted_as: str = ""  # the mechanisms counted: a resume must not change them


@dataclass
class ClientCounts:
    """Per-client reports and DP-SGD steps; the worst client's epsilon under each mechanism."""

    config: PrivacyConfig
    plugin: str  # the algorithm's name, for the error of a client that trained outside DP-SGD
    reports: dict[int, int] = field(default_factory=dict)
    sampled: dict[int, dict[tuple[int, int], int]] = field(default_factory=dict)  # (n, batch) -> steps
    worst_sample: float = 0.0

    def record(self, clients: Sequence[TrainedClient]) -> None:
        """Counts this round's trained clients: a report each, and the noised steps they report.

        Raises:
            ConfigError: under ``privacy.sample``, a client whose metrics lack DP-SGD's counts.
        """
        for client in clients:
            self.reports[client.client_id] = self.reports.get(client.client_id, 0) + 1
            if self.config.sample is None:
                continue
            examples, batch_size, steps = self._counts(client)
            if steps == 0:  # nothing released: nothing spent (a client recalling its kept model)
                continue
            runs = self.sampled.setdefault(client.client_id, {})
            runs[examples, batch_size] = runs.get((examples, batch_size), 0) + steps
            self.worst_sample = max(self.worst_sample, self.sample_epsilon(client.client_id))

    def _counts(self, client: TrainedClient) -> tuple[int, int, int]:
        """The client's (examples, batch size, noised steps); none of them may be missing."""
        metrics = client.metrics
        missing = [key for key in (EXAMPLES_METRIC, BATCH_METRIC, STEPS_METRIC) if key not in metrics]
        if missing:
            raise ConfigError(
                [
                    f"privacy.sample: client {client.client_id} of algorithm {self.plugin!r} reported no "
                    f"{', '.join(missing)}: it trained outside DP-SGD's seam (train_client or "
                    f"train_context), or dropped the counts from its metrics, so its spending is "
                    f"unknown; return train_local's metrics with them, or drop privacy.sample"
                ]
            )
        return int(metrics[EXAMPLES_METRIC]), int(metrics[BATCH_METRIC]), int(metrics[STEPS_METRIC])

    def sample_epsilon(self, client_id: int) -> float:
        """The epsilon ``client_id``'s DP-SGD has spent so far (0 before its first noised step)."""
        assert self.config.sample is not None and self.config.delta is not None
        runs = tuple(
            SampledSteps(n, batch, steps) for (n, batch), steps in self.sampled.get(client_id, {}).items()
        )
        return sample_epsilon(self.config.sample, runs, self.config.delta) if runs else 0.0

    def accounted_as(self) -> str:
        """The client-side mechanisms in words: a resume that changes them is refused (the counts
        compose one kind of report and step)."""
        return f"local {self.config.local}, sample {self.config.sample}, delta {self.config.delta}"

    def metrics(self) -> Metrics:
        """The worst client's epsilon so far under local DP and under DP-SGD."""
        out: Metrics = {}
        if self.config.local is not None:
            most = max(self.reports.values(), default=0)
            out["privacy/local/epsilon"] = local_epsilon(self.config.local, most, self.config.delta)
            out["privacy/local/max_reports"] = float(most)
        if self.config.sample is not None:
            out["privacy/sample/epsilon"] = self.worst_sample
        return out

    def state(self) -> dict[str, object]:
        """What a checkpoint keeps: ``ClientCountsState`` as the plain dict of its fields."""
        sampled = {
            client: tuple((n, batch, steps) for (n, batch), steps in runs.items())
            for client, runs in self.sampled.items()
        }
        saved = plain(ClientCountsState(dict(self.reports), sampled, self.worst_sample, self.accounted_as()))
        assert isinstance(saved, dict)
        return saved

    def restore(self, saved: object, path: str) -> None:
        """A resumed run goes on counting from the checkpoint's clients.

        Raises:
            CheckpointError: ``saved`` is no ``ClientCountsState`` (missing, or corrupt); names
                ``path`` and the fix.
        """
        try:
            state = rebuild(ClientCountsState({}, {}, 0.0, ""), saved, "privacy.clients")
            reports, sampled = _reports(state.reports), _sampled(state.sampled)
            worst = _worst(state.worst_sample)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path}: its clients' privacy counts are unreadable ({exc}); resume from another "
                "checkpoint, or drop --resume to start the run afresh"
            ) from None
        if state.accounted_as != self.accounted_as():
            raise CheckpointError(
                f"{path}: its clients were counted under {state.accounted_as}; this job's are "
                f"{self.accounted_as()}: resume with that run's privacy: section, or drop --resume"
            )
        self.reports, self.sampled, self.worst_sample = reports, sampled, worst


def _reports(saved: object) -> dict[int, int]:
    if not isinstance(saved, dict):
        raise TypeError(f"reports is a {type(saved).__name__}, not a dict")
    return {_count(client): _count(n) for client, n in saved.items()}


def _sampled(saved: object) -> dict[int, dict[tuple[int, int], int]]:
    if not isinstance(saved, dict):
        raise TypeError(f"sampled is a {type(saved).__name__}, not a dict")
    out: dict[int, dict[tuple[int, int], int]] = {}
    for client, runs in saved.items():
        if not isinstance(runs, (list, tuple)) or not all(
            isinstance(run, (list, tuple)) and len(run) == 3 for run in runs
        ):
            raise ValueError(
                f"client {client}'s steps are {runs!r}, not (examples, batch size, steps) triples"
            )
        out[_count(client)] = {(_count(n), _count(batch)): _count(steps) for n, batch, steps in runs}
    return out


def _worst(saved: object) -> float:
    if not isinstance(saved, (int, float)) or isinstance(saved, bool) or not 0 <= saved < math.inf:
        raise ValueError(f"worst_sample {saved!r} is no epsilon")
    return float(saved)


def _count(value: object) -> int:
    """A saved count: a non-negative int (a bool or a float is a corrupt one)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is no count")
    return value
