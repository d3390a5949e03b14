"""The server's side of ``compression.download``: the broadcast sent as an encoded difference from
the model the clients already hold (bidirectional compression with error feedback: Tang et al.
2019, DoubleSqueeze, arXiv:1905.05957).

The server keeps the public model ``x̂`` (what every client reconstructs from the messages), the
model it broadcast last round, and the encoder's memory (error feedback's residual ``e``,
PowerSGD's Q). Each round it encodes its model's change since last round, ``x_t - x_{t-1}``
(plus ``e``, with error feedback: then ``x_t - x̂``), and adds the decoded message to ``x̂``; the
clients train from ``x̂``. With error feedback ``x̂ + e == x_t`` after every round. ``x̂`` starts
as the first model broadcast, which the clients are assumed to hold (built from the run's seed, or
downloaded once outside the count), so round 0 sends a change of zero.

The draws (random-k's coordinates, QSGD's rounding) come from a generator seeded by (run seed,
round) (``raysim.sampling.download_seed``): every client draws alike, so random-k sends no index.

Usage:
    downlink = Downlink(encoder_of(job.compression.download), job.seed)
    payload = downlink.send(payload, round_num)  # params: x̂; params_bytes: the message's
    saved = downlink.state()                      # into the checkpoint; Downlink.restore(saved)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from raysim import params as P
from raysim.compress.codec import Encoder, Memory, encode_tree
from raysim.sampling import download_seed
from raysim.types import Params, Payload


@dataclass
class Downlink:
    """The server's encoder for its broadcast and what it keeps between rounds."""

    encoder: Encoder
    seed: int
    public: Params | None = None  # x̂, as every client holds it; None: before the first broadcast
    last: Params = field(default_factory=dict)  # x_{t-1}: the server's model broadcast last round
    memory: dict[str, Memory] = field(default_factory=dict)  # per tensor: e, PowerSGD's Q

    def send(self, payload: Payload, round_num: int) -> Payload:
        """The payload as the clients decode it: its params ``x̂``, ``params_bytes`` the message's
        exact size (integer tensors travel whole)."""
        current = P.clone(P.from_numpy(payload.params))
        if self.public is None:  # the clients hold the first model already
            self.public, self.last = P.clone(current), current
        change = {k: v - self.last[k] if v.is_floating_point() else v for k, v in current.items()}
        generator = torch.Generator().manual_seed(download_seed(self.seed, round_num))
        decoded, sent, self.memory = encode_tree(self.encoder, change, self.memory, generator)
        public = self.public
        self.public = {k: public[k] + d if d.is_floating_point() else d for k, d in decoded.items()}
        self.last = current
        return replace(payload, params=P.to_numpy(self.public), params_bytes=sent)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (plain tensors), so that a resumed run sends what this one would."""
        return {"public": self.public, "last": self.last, "memory": self.memory}

    def restore(self, saved: dict[str, Any]) -> None:
        self.public, self.last, self.memory = saved["public"], saved["last"], saved["memory"]
