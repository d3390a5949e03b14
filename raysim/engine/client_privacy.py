"""What the clients have spent under local DP and DP-SGD: each client's reports and noised steps,
and the most epsilon any client has spent so far (docs/privacy.md).

A client's guarantee is its own: local DP composes over the rounds it reported in, DP-SGD over the
noised gradient steps it took (``raysim.privacy.per_client``). The engine records each trained
client after its round; the logged figure is the worst client's, the one a guarantee must quote.
The counts are part of every checkpoint, so a resumed run goes on counting.

Usage:
    clients = ClientPrivacy(job.privacy, examples=store.num_examples("train"), batch_size=16)
    clients.record(output.clients)
    clients.metrics()  # privacy/local/epsilon, privacy/sample/epsilon
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raysim.config import PluginSection
from raysim.config.privacy import PrivacyConfig
from raysim.errors import ConfigError
from raysim.plugin_defaults import local_section
from raysim.privacy.per_client import local_epsilon, sample_epsilon
from raysim.types import Metrics, TrainedClient


@dataclass
class ClientPrivacy:
    """Per-client reports and DP-SGD steps; the worst client's epsilon under each mechanism."""

    config: PrivacyConfig
    examples: np.ndarray  # each client's training examples, by client id
    batch_size: int | None  # the plugin's local batch size (DP-SGD's expected batch)
    reports: dict[int, int] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    worst_sample: float = 0.0  # the most any client's DP-SGD has spent

    def record(self, clients: Sequence[TrainedClient]) -> None:
        """Counts this round's trained clients: a report each, and the steps they trained."""
        for client in clients:
            self.reports[client.client_id] = self.reports.get(client.client_id, 0) + 1
            if self.config.sample is not None:
                taken = int(client.metrics.get("train/steps", 0))
                self.steps[client.client_id] = total = self.steps.get(client.client_id, 0) + taken
                self.worst_sample = max(self.worst_sample, self._sample_epsilon(client.client_id, total))

    def _sample_epsilon(self, client_id: int, steps: int) -> float:
        assert self.config.sample is not None and self.config.delta is not None and self.batch_size
        return sample_epsilon(
            self.config.sample, int(self.examples[client_id]), self.batch_size, steps, self.config.delta
        )

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

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: each client's reports and steps, and the worst DP-SGD epsilon."""
        return {"reports": dict(self.reports), "steps": dict(self.steps), "worst_sample": self.worst_sample}

    def restore(self, saved: dict[str, Any], path: str) -> None:
        """A resumed run goes on counting from the checkpoint's clients."""
        try:
            self.reports = {int(k): int(v) for k, v in saved["reports"].items()}
            self.steps = {int(k): int(v) for k, v in saved["steps"].items()}
            self.worst_sample = float(saved["worst_sample"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            unreadable = f"{path}: its clients' privacy counts are unreadable ({exc!r})"
            raise ConfigError([f"{unreadable}; resume from another checkpoint"]) from None


def local_batch_size(section: PluginSection) -> int | None:
    """The plugin's local batch size (DP-SGD's expected batch), or a wrapped plugin's (IMA's
    ``inner``); None where it trains without ``local``."""
    local = local_section(section.config)
    if local is not None:
        return getattr(local, "batch_size", None)
    inner = getattr(section.config, "inner", None)
    return local_batch_size(inner) if isinstance(inner, PluginSection) else None
