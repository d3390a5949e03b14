"""The encoder protocol, error feedback, and an update tree encoded tensor by tensor.

An encoder sees one tensor, what it kept for that tensor last round (``memory``: PowerSGD's Q;
empty the first time) and a generator for its random draws. It returns what the receiver decodes,
the exact bytes of the encoded message, and what to keep for next round. Bytes count as sent on
the wire: values in the tensor's dtype, scales and norms as float32, indices and signs bit-packed.

Usage:
    encoder = ErrorFeedback(TopSparse(fraction=0.01))           # raysim.compress.upload.encoder_of
    decoded, num_bytes, memory = encode_tree(encoder, delta, memory, generator)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from raysim.types import Params

Memory = dict[str, torch.Tensor]  # what an encoder keeps for one tensor between rounds
SCALE_BYTES = 4  # a norm or a scale travels as one float32


@dataclass(frozen=True)
class Encoded:
    """One tensor as the receiver decodes it, what its message weighs, what the sender keeps."""

    decoded: torch.Tensor
    num_bytes: int
    memory: Memory


class Encoder(Protocol):
    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        """``tensor`` encoded (``memory`` as kept last round, {} the first time)."""
        ...


def dense_bytes(tensor: torch.Tensor) -> int:
    """The tensor sent whole, in its own dtype."""
    return tensor.numel() * tensor.element_size()


def whole(tensor: torch.Tensor) -> Encoded:
    """The tensor sent dense: where an encoding would not be smaller (and nothing is kept)."""
    return Encoded(tensor.clone(), dense_bytes(tensor), {})


def packed_bytes(count: int, bits: int) -> int:
    """``count`` values of ``bits`` bits each, packed into whole bytes."""
    return math.ceil(count * bits / 8)


@dataclass(frozen=True)
class ErrorFeedback:
    """Error feedback (Seide et al. 2014; Karimireddy et al. 2019): the part of ``tensor + residual``
    that the inner encoder did not send is kept and added to the next round's tensor."""

    inner: Encoder

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        own = {k: v for k, v in memory.items() if k != "residual"}
        corrected = tensor + memory["residual"] if "residual" in memory else tensor
        sent = self.inner.encode(corrected, own, generator)
        return Encoded(sent.decoded, sent.num_bytes, sent.memory | {"residual": corrected - sent.decoded})


def encode_tree(
    encoder: Encoder, tree: Params, memory: dict[str, Memory], generator: torch.Generator
) -> tuple[Params, int, dict[str, Memory]]:
    """Every tensor of ``tree`` encoded in the tree's order (one generator drawn in turn): the
    decoded tree, the bytes of all messages, the memory to keep. Integer tensors travel whole."""
    decoded: Params = {}
    kept: dict[str, Memory] = {}
    total = 0
    for name, tensor in tree.items():
        if not tensor.is_floating_point():
            decoded[name], total = tensor, total + dense_bytes(tensor)
            continue
        sent = encoder.encode(tensor, memory.get(name, {}), generator)
        decoded[name], kept[name], total = sent.decoded, sent.memory, total + sent.num_bytes
    return decoded, total, kept
