"""Whole trees (raysim/compress/codec.py): the exact bytes of every encoder on a known tree."""

from __future__ import annotations

import math

import pytest
import torch
from encoder_inputs import gen

from raysim.compress.codec import ErrorFeedback, encode_tree
from raysim.compress.lowrank import LowRank
from raysim.compress.quantize import Quantized, Sign
from raysim.compress.sparse import RandomSparse, TopSparse

TREE = {"w": torch.randn(16, 64, generator=gen(12)), "b": torch.randn(16, generator=gen(13))}


@pytest.mark.parametrize(
    "encoder, expected",
    [
        # w: k = ceil(10.24) = 11 values (44 B) + 11 indices of 10 bits (14 B);
        # b: k = ceil(0.16) = 1 value (4 B) + 1 index of 4 bits (1 B)
        (TopSparse(0.01), 44 + 14 + 4 + 1),
        (RandomSparse(0.1), 103 * 4 + 2 * 4),  # k = 103 and 2; no index: the seed is shared
        # a sign and 4 bits each; a float32 norm per bucket: 2 of w's 1024 values, 1 of b's 16
        (Quantized(4, 512), math.ceil(1024 * 5 / 8) + 2 * 4 + math.ceil(16 * 5 / 8) + 4),
        (Quantized(4, 100), math.ceil(1024 * 5 / 8) + 11 * 4 + math.ceil(16 * 5 / 8) + 4),
        (Quantized(4, 0), math.ceil(1024 * 5 / 8) + 4 + math.ceil(16 * 5 / 8) + 4),  # a norm each
        (Sign(), 1024 // 8 + 4 + 16 // 8 + 4),  # a bit each and a float32 scale
        (LowRank(2), (16 + 64) * 2 * 4 + 16 * 4),  # P and Q of w; b whole
        (TopSparse(1.0), (1024 + 16) * 4),  # k == d: whole, no index
    ],
)
def test_exact_bytes_of_each_encoder_on_a_known_tree(encoder, expected):
    _, num_bytes, _ = encode_tree(encoder, TREE, {}, gen())
    assert num_bytes == expected
    _, with_feedback, _ = encode_tree(ErrorFeedback(encoder), TREE, {}, gen())
    assert with_feedback == expected  # the residual stays on the client


def test_integer_tensors_travel_whole():
    tree = {"n": torch.tensor([3, 4], dtype=torch.int64)}
    decoded, num_bytes, memory = encode_tree(Sign(), tree, {}, gen())
    assert torch.equal(decoded["n"], tree["n"]) and num_bytes == 16 and memory == {}
