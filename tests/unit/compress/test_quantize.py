"""QSGD and the scaled sign (raysim/compress/quantize.py) against the numpy reference."""

from __future__ import annotations

import math

import numpy as np
import torch
from encoder_inputs import gen
from encoder_reference import qsgd_variance, qsgd_variance_bound, scaled_sign

from raysim.compress.codec import ErrorFeedback
from raysim.compress.quantize import Quantized, Sign


def test_qsgd_is_unbiased():
    """Each coordinate's mean over N draws is within 5 standard errors of the input: a draw's
    deviation has variance (||v|| / s)^2 p (1 - p) <= (||v|| / 2s)^2 (reference.qsgd_variance)."""
    v, bits, draws = torch.randn(40, generator=gen(1)).double(), 2, 4000
    g, encoder = gen(7), Quantized(bits)
    mean = torch.stack([encoder.encode(v, {}, g).decoded for _ in range(draws)]).mean(0)
    s = 2**bits - 1
    tolerance = 5 * v.norm() / (2 * s) / math.sqrt(draws)
    assert (mean - v).abs().max() < tolerance
    assert (mean - v).abs().max() > 0  # the draws are random, not a rounding


def test_qsgd_variance_is_the_papers_and_within_its_bound():
    v, bits, draws = torch.randn(64, generator=gen(2)).double(), 3, 4000
    g, encoder = gen(3), Quantized(bits)
    errors = torch.stack([((encoder.encode(v, {}, g).decoded - v) ** 2).sum() for _ in range(draws)])
    exact = qsgd_variance(v.numpy(), bits)
    # the mean of N squared errors: within 5 of its standard errors of the exact variance
    assert abs(float(errors.mean()) - exact) < 5 * float(errors.std()) / math.sqrt(draws)
    assert exact <= qsgd_variance_bound(v.numpy(), bits)
    assert float(errors.mean()) <= qsgd_variance_bound(v.numpy(), bits)


def test_qsgd_levels_are_the_s_levels_of_the_norm():
    v = torch.randn(30, generator=gen(4)).double()
    decoded = Quantized(2).encode(v, {}, gen()).decoded
    levels = decoded.abs() / v.norm() * 3  # s = 3
    torch.testing.assert_close(levels, levels.round())
    assert set(levels.round().tolist()) <= {0.0, 1.0, 2.0, 3.0}


def test_scaled_sign_is_the_l1_scale_times_the_sign():
    p = torch.tensor([0.5, -2.0, 0.0, 1.5], dtype=torch.float64)
    decoded = Sign().encode(p, {}, gen()).decoded
    np.testing.assert_allclose(decoded.numpy(), scaled_sign(p.numpy()))
    np.testing.assert_allclose(decoded.numpy(), [1.0, -1.0, 1.0, 1.0])  # ||p||_1 / d = 4 / 4


def test_sign_with_error_feedback_keeps_what_the_scale_missed():
    p = torch.tensor([3.0, -1.0], dtype=torch.float64)
    sent = ErrorFeedback(Sign()).encode(p, {}, gen())
    torch.testing.assert_close(sent.memory["residual"], torch.tensor([1.0, 1.0], dtype=torch.float64))
