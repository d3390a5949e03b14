"""The encoders against the numpy references (``encoder_reference.py``) and hand-counted bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from encoder_reference import power_step, qsgd_variance, qsgd_variance_bound, scaled_sign, top_k_indices

from raysim.compress.codec import ErrorFeedback, encode_tree
from raysim.compress.lowrank import LowRank
from raysim.compress.quantize import Quantized, Sign
from raysim.compress.sparse import RandomSparse, TopSparse, index_bits, num_kept


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def distinct(*shape: int, seed: int = 0) -> torch.Tensor:
    """Values of distinct magnitudes, signs mixed: top-k's answer is unique."""
    n = math.prod(shape)
    magnitudes = torch.randperm(n, generator=gen(seed)).double() + 1
    signs = torch.where(torch.rand(n, generator=gen(seed + 1)) < 0.5, -1.0, 1.0).double()
    return (magnitudes * signs).reshape(shape)


def test_top_k_sends_the_k_largest_magnitudes():
    x = distinct(20, 30)
    sent = TopSparse(0.05).encode(x, {}, gen())
    k = num_kept(0.05, x.numel())
    assert k == 30
    nonzero = {int(i) for i in sent.decoded.reshape(-1).nonzero()}
    assert nonzero == top_k_indices(x.numpy(), k)
    assert torch.equal(sent.decoded.reshape(-1)[list(nonzero)], x.reshape(-1)[list(nonzero)])


def test_top_k_with_error_feedback_sends_over_the_rounds_what_it_was_given():
    """After R rounds: sum of what was sent + the residual == sum of the updates, exactly."""
    encoder, memory = ErrorFeedback(TopSparse(0.1)), {}
    updates = [torch.randn(50, generator=gen(r)).double() for r in range(5)]
    sent_total = torch.zeros(50, dtype=torch.float64)
    for update in updates:
        sent = encoder.encode(update, memory, gen())
        sent_total += sent.decoded
        memory = sent.memory
        assert int(sent.decoded.count_nonzero()) == 5
    torch.testing.assert_close(sent_total + memory["residual"], sum(updates), rtol=0, atol=1e-12)
    # the residual is carried: round 2 picks from update + what round 1 left, not from the update
    first = encoder.encode(updates[0], {}, gen())
    second = encoder.encode(updates[1], first.memory, gen())
    corrected = (updates[1] + first.memory["residual"]).numpy()
    assert {int(i) for i in second.decoded.nonzero()} == top_k_indices(corrected, 5)


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


def test_random_k_draws_are_the_generators():
    x = torch.randn(100, generator=gen(11))
    a, b = (RandomSparse(0.1).encode(x, {}, gen(5)).decoded for _ in range(2))
    c = RandomSparse(0.1).encode(x, {}, gen(6)).decoded
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert int(a.count_nonzero()) == 10


TREE = {"w": torch.randn(16, 64, generator=gen(12)), "b": torch.randn(16, generator=gen(13))}


@pytest.mark.parametrize(
    "encoder, expected",
    [
        # w: k = round(10.24) = 10 values (40 B) + 10 indices of 10 bits (13 B);
        # b: k = round(0.16) -> 1 value (4 B) + 1 index of 4 bits (1 B)
        (TopSparse(0.01), 40 + 13 + 4 + 1),
        (RandomSparse(0.1), 102 * 4 + 2 * 4),  # k = 102 and 2; no index: the seed is shared
        (Quantized(4), math.ceil(1024 * 5 / 8) + 4 + math.ceil(16 * 5 / 8) + 4),  # sign + 4 bits, a norm
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


def test_index_bits_number_every_coordinate():
    assert [index_bits(d) for d in (2, 3, 4, 5, 1024, 1025)] == [1, 2, 2, 3, 10, 11]


def test_integer_tensors_travel_whole():
    tree = {"n": torch.tensor([3, 4], dtype=torch.int64)}
    decoded, num_bytes, memory = encode_tree(Sign(), tree, {}, gen())
    assert torch.equal(decoded["n"], tree["n"]) and num_bytes == 16 and memory == {}
