"""PowerSGD (raysim/compress/lowrank.py) against a numpy QR-based step."""

from __future__ import annotations

import numpy as np
import torch
from encoder_inputs import gen
from encoder_reference import power_step

from raysim.compress.lowrank import LowRank


def test_power_sgd_one_step_matches_numpy_qr_and_warm_starts():
    m1, m2 = torch.randn(12, 3, 3, generator=gen(5)).double(), torch.randn(12, 9, generator=gen(6)).double()
    q0 = torch.randn(9, 2, generator=gen(8)).double()
    encoder = LowRank(2)
    first = encoder.encode(m1, {"q": q0}, gen())
    decoded, q1 = power_step(m1.reshape(12, 9).numpy(), q0.numpy())
    np.testing.assert_allclose(first.decoded.reshape(12, 9).numpy(), decoded, atol=1e-10)
    assert first.decoded.shape == m1.shape
    second = encoder.encode(m2, first.memory, gen())  # Q' of round 1 starts round 2
    np.testing.assert_allclose(second.decoded.numpy(), power_step(m2.numpy(), q1)[0], atol=1e-10)


def test_power_sgd_sends_vectors_whole():
    bias = torch.randn(7, generator=gen(9))
    assert torch.equal(LowRank(4).encode(bias, {}, gen()).decoded, bias)


def test_power_sgd_sends_whole_a_matrix_its_factors_would_outweigh():
    """10 x 3 at rank 4 (r = 3): (10 + 3) 3 = 39 float32 (156 B) against 30 (120 B). A rank
    capped at min(n, m) always is such a matrix: (n + m) m >= n m."""
    m = torch.randn(10, 3, generator=gen(11))
    sent = LowRank(4).encode(m, {}, gen())
    assert sent.num_bytes == 120 and torch.equal(sent.decoded, m) and sent.memory == {}
    assert LowRank(1).encode(m, {}, gen()).num_bytes == (10 + 3) * 4  # 52 B < 120 B: factors


def test_power_sgd_redraws_a_kept_q_that_is_zero():
    """A zero change (a download's round 0) leaves Q = M^T P = 0; a step from it spans nothing and
    decoded the first rows of the next matrix. It starts afresh from a random Q instead."""
    matrix = torch.tensor(np.random.default_rng(0).normal(size=(8, 6)), dtype=torch.float32)
    zero_kept = LowRank(2).encode(torch.zeros(8, 6), {}, gen()).memory
    assert not zero_kept["q"].any()
    fresh = LowRank(2).encode(matrix, {}, gen(5)).decoded
    after_zero = LowRank(2).encode(matrix, zero_kept, gen(5)).decoded
    assert torch.equal(after_zero, fresh)
