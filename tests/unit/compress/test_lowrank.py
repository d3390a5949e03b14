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


def test_power_sgd_sends_vectors_whole_and_caps_the_rank():
    bias = torch.randn(7, generator=gen(9))
    assert torch.equal(LowRank(4).encode(bias, {}, gen()).decoded, bias)
    thin = torch.randn(5, 2, generator=gen(10)).double()
    sent = LowRank(4).encode(thin, {}, gen())  # rank 2 at most: exact
    torch.testing.assert_close(sent.decoded, thin)
    assert sent.memory["q"].shape == (2, 2)
