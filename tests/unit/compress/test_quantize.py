"""QSGD and the scaled sign (raysim/compress/quantize.py) against the numpy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from encoder_inputs import gen
from encoder_reference import buckets, qsgd_variance, qsgd_variance_bound, scaled_sign

from raysim.compress.codec import ErrorFeedback
from raysim.compress.quantize import Quantized, Sign


def test_qsgd_is_unbiased():
    """Each coordinate's mean over N draws is within 5 standard errors of the input: a draw's
    deviation has variance (||b|| / s)^2 p (1 - p) <= (||b|| / 2s)^2, b its bucket
    (reference.qsgd_variance); buckets of 16, 16 and 8 values."""
    v, bits, draws = torch.randn(40, generator=gen(1)).double(), 2, 4000
    g, encoder = gen(7), Quantized(bits, 16)
    mean = torch.stack([encoder.encode(v, {}, g).decoded for _ in range(draws)]).mean(0)
    s, norms = 2**bits - 1, [np.linalg.norm(b) for b in buckets(v.numpy(), 16)]
    assert len(norms) == 3
    tolerance = 5 * max(norms) / (2 * s) / math.sqrt(draws)
    assert (mean - v).abs().max() < tolerance
    assert (mean - v).abs().max() > 0  # the draws are random, not a rounding


@pytest.mark.parametrize("bucket", [0, 16, 500])
def test_qsgd_variance_is_the_papers_and_within_its_bound(bucket):
    v, bits, draws = torch.randn(64, generator=gen(2)).double(), 3, 4000
    g, encoder = gen(3), Quantized(bits, bucket)
    errors = torch.stack([((encoder.encode(v, {}, g).decoded - v) ** 2).sum() for _ in range(draws)])
    exact = qsgd_variance(v.numpy(), bits, bucket)
    # the mean of N squared errors: within 5 of its standard errors of the exact variance
    assert abs(float(errors.mean()) - exact) < 5 * float(errors.std()) / math.sqrt(draws)
    assert exact <= qsgd_variance_bound(v.numpy(), bits, bucket)
    assert float(errors.mean()) <= qsgd_variance_bound(v.numpy(), bits, bucket)


def test_buckets_cut_the_error_of_a_large_tensor():
    """4 bits, d = 20000: one norm for the tensor vs one per 512 values (reference variances)."""
    v = torch.randn(20000, generator=gen(5)).double()
    whole, bucketed = (Quantized(4, b).encode(v, {}, gen(6)).decoded for b in (0, 512))
    relative = [float(((x - v) ** 2).sum() / (v**2).sum()) for x in (whole, bucketed)]
    expected = [qsgd_variance(v.numpy(), 4, b) / float((v**2).sum()) for b in (0, 512)]
    assert expected[1] < expected[0] / 10
    for got, want in zip(relative, expected, strict=True):
        assert got == pytest.approx(want, rel=0.1)


@pytest.mark.parametrize("bucket", [0, 7])
def test_qsgd_levels_are_the_s_levels_of_each_buckets_norm(bucket):
    v = torch.randn(30, generator=gen(4)).double()
    decoded = Quantized(2, bucket).encode(v, {}, gen()).decoded.numpy()
    for b, sent in zip(buckets(v.numpy(), bucket), buckets(decoded, bucket), strict=True):
        levels = np.abs(sent) / np.linalg.norm(b) * 3  # s = 3
        np.testing.assert_allclose(levels, levels.round(), atol=1e-12)
        assert set(levels.round().tolist()) <= {0.0, 1.0, 2.0, 3.0}


def test_a_zero_bucket_is_sent_as_zeros():
    v = torch.cat([torch.zeros(4), torch.ones(4)]).double()
    decoded = Quantized(2, 4).encode(v, {}, gen()).decoded
    assert torch.equal(decoded[:4], torch.zeros(4, dtype=torch.float64))
    assert torch.isfinite(decoded).all()


def test_scaled_sign_is_the_l1_scale_times_the_sign():
    p = torch.tensor([0.5, -2.0, 0.0, 1.5], dtype=torch.float64)
    decoded = Sign().encode(p, {}, gen()).decoded
    np.testing.assert_allclose(decoded.numpy(), scaled_sign(p.numpy()))
    np.testing.assert_allclose(decoded.numpy(), [1.0, -1.0, 1.0, 1.0])  # ||p||_1 / d = 4 / 4


def test_sign_with_error_feedback_keeps_what_the_scale_missed():
    p = torch.tensor([3.0, -1.0], dtype=torch.float64)
    sent = ErrorFeedback(Sign()).encode(p, {}, gen())
    torch.testing.assert_close(sent.memory["residual"], torch.tensor([1.0, 1.0], dtype=torch.float64))
