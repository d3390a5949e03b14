"""The worker's side of ``compression.upload``: each client's update encoded right after it is
produced, before the worker folds it into its partial, so the partial sums what the server
decodes and ``sys/bytes_up`` counts what the encoded message weighs.

The encoder's memory (error feedback's residual, PowerSGD's Q) is the client's: it lives in the
client-state store beside the plugin's own state, as ``{"plugin": ..., "codec": ...}``, so it
survives rounds, worker restarts and checkpoints with it. The encoder's draws come from a
generator seeded by (run seed, round, client) (``raysim.sampling.compression_seed``).

The worker checks the update before it is encoded; ``send`` checks what it decoded and keeps, so
no client's memory holds NaN for a later round to send.

Without ``compression`` the uplink sends the update as it is and counts its bytes.

Usage:
    uplink = Uplink.of(job, lambda c, r: states.get(c, before_round=r))  # the stored state
    result, sent_bytes = uplink.send(result, client_id, round_num)
    plugin_state = uplink.plugin_part(states.get(client_id, before_round=r))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from raysim import params as P
from raysim.compress.codec import Encoder, ErrorFeedback, Memory, encode_tree
from raysim.compress.lowrank import LowRank
from raysim.compress.quantize import Quantized, Sign
from raysim.compress.sparse import RandomSparse, TopSparse
from raysim.config import JobConfig
from raysim.config.compression import QSGD, EncoderConfig, RandomK, ScaledSign, TopK
from raysim.config.plugins import update_delta
from raysim.errors import NonFiniteError
from raysim.registry import get
from raysim.sampling import compression_seed
from raysim.stored import plain
from raysim.types import ClientResult, Params


def encoder_of(config: EncoderConfig) -> Encoder:
    """The configured encoder, wrapped in error feedback where ``error_feedback`` is set."""
    encoder: Encoder
    if isinstance(config, TopK):
        encoder = TopSparse(config.fraction)
    elif isinstance(config, RandomK):
        encoder = RandomSparse(config.fraction, unbiased=not config.error_feedback)
    elif isinstance(config, QSGD):
        encoder = Quantized(config.bits, config.bucket or 0)
    elif isinstance(config, ScaledSign):
        encoder = Sign()
    else:
        encoder = LowRank(config.rank)
    return ErrorFeedback(encoder) if config.error_feedback else encoder


Recall = Callable[[int, int], Any]  # (client id, round) -> the client's stored state before that round


@dataclass(frozen=True)
class Uplink:
    """How a worker sends each client's update: encoded (``encoder``) or as it is (None)."""

    encoder: Encoder | None = None
    delta: str = ""  # where the update holds its delta: "" the update itself, else its field
    seed: int = 0
    recall: Recall | None = None

    @classmethod
    def of(cls, job: JobConfig, recall: Recall) -> Uplink:
        """The job's uplink; the plugin's ``UPDATE_DELTA`` says where its delta is."""
        if job.compression is None or job.compression.upload is None:
            return cls()
        section = job.algorithm
        where = update_delta(get("algorithm", section.name).factory, section.config)
        assert where is not None, "validate_job refuses a plugin without a delta"
        return cls(encoder_of(job.compression.upload), where, job.seed, recall)

    @property
    def keeps_state(self) -> bool:
        """Whether ``send`` joins every client's state with the encoder's memory, to be kept."""
        return self.encoder is not None

    def plugin_part(self, saved: Any) -> Any:
        """The plugin's own state out of what the store holds for a client."""
        return saved if self.encoder is None or saved is None else saved["plugin"]

    def send(self, result: ClientResult, client_id: int, round_num: int) -> tuple[ClientResult, int]:
        """The result as the server decodes it, its state joined by the encoder's memory, and the
        bytes its update weighs on the wire (the delta encoded, any other field whole)."""
        if self.encoder is None or self.recall is None:
            return result, P.num_bytes(result.update)
        saved = self.recall(client_id, round_num)
        memory: dict[str, Memory] = {} if saved is None else saved["codec"]
        delta = _delta_of(result.update, self.delta)
        device = next(iter(delta.values())).device if delta else torch.device("cpu")
        generator = torch.Generator(device).manual_seed(compression_seed(self.seed, round_num, client_id))
        decoded, sent, memory = encode_tree(self.encoder, delta, memory, generator)
        _check_finite(decoded, memory)  # what the server sums, and what the client keeps
        update = decoded if not self.delta else replace(result.update, **{self.delta: decoded})
        rest = P.num_bytes(result.update) - P.num_bytes(delta)  # the other fields travel whole
        state = {"plugin": plain(result.state), "codec": memory}
        return replace(result, update=update, state=state), sent + rest


def _check_finite(decoded: Params, memory: dict[str, Memory]) -> None:
    """Refuses an encoded update, or the memory kept for the next round, that is not finite: last
    round's residual held NaN, or its sum with the update overflowed; the server would sum NaN.

    Raises:
        NonFiniteError: naming the tensors.
    """
    sent = {"decoded": decoded, "memory": memory}
    if P.is_finite(sent):
        return
    bad = P.nonfinite_names(sent)
    raise NonFiniteError(
        f"the encoded update holds NaN or infinity in {bad[:5]}{' ...' if len(bad) > 5 else ''}; "
        f"the update or its error-feedback residual is not finite, or their sum overflowed (lower the "
        f"learning rate, or set local.grad_clip)"
    )


def _delta_of(update: Any, where: str) -> Params:
    if not where:
        return dict(update)
    if where not in {f.name for f in fields(update)}:
        raise TypeError(f"the update {type(update).__name__} has no field {where!r} (its UPDATE_DELTA)")
    delta: Params = getattr(update, where)
    return delta
