"""Top-k and random-k (raysim/compress/sparse.py) against the numpy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from encoder_inputs import distinct, gen
from encoder_reference import top_k_indices

from raysim.compress.codec import ErrorFeedback
from raysim.compress.sparse import RandomSparse, TopSparse, index_bits, num_kept
from raysim.compress.upload import encoder_of
from raysim.config.compression import RandomK


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


def test_random_k_draws_are_the_generators():
    x = torch.randn(100, generator=gen(11))
    a, b = (RandomSparse(0.1).encode(x, {}, gen(5)).decoded for _ in range(2))
    c = RandomSparse(0.1).encode(x, {}, gen(6)).decoded
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert int(a.count_nonzero()) == 10


def test_index_bits_number_every_coordinate():
    assert [index_bits(d) for d in (2, 3, 4, 5, 1024, 1025)] == [1, 2, 2, 3, 10, 11]


@pytest.mark.parametrize(
    "fraction, d, k",
    [(0.25, 10, 3), (0.01, 1050, 11), (0.07, 100, 7), (0.14, 100, 14), (0.001, 10, 1), (1.0, 7, 7)],
)
def test_k_is_the_fraction_of_d_rounded_up(fraction, d, k):
    """ceil(fraction * d): 2.5 -> 3 and 10.5 -> 11 (at least the fraction asked); 0.07 * 100 is
    7.000000000000001 in floats and 0.14 * 100 is 14.000000000000002, yet k is 7 and 14."""
    assert num_kept(fraction, d) == k


def test_top_k_of_a_large_fraction_sends_the_tensor_whole():
    """0.9 of 1000 float32: 900 values (3600 B) and 900 indices of 10 bits (1125 B) would weigh
    more than the 4000 B of the tensor."""
    x = torch.randn(1000, generator=gen(3))
    sent = ErrorFeedback(TopSparse(0.9)).encode(x, {}, gen())
    assert sent.num_bytes == 4000 and torch.equal(sent.decoded, x)
    assert torch.equal(sent.memory["residual"], torch.zeros(1000))
    assert TopSparse(0.7).encode(x, {}, gen()).num_bytes == 700 * 4 + math.ceil(700 * 10 / 8)  # 3675


def test_random_k_without_error_feedback_is_unbiased():
    """Scaled by d / k (Wangni et al. 2018): each coordinate's mean over N draws is within 5
    standard errors of x, a draw's deviation having variance x_i^2 (d / k - 1); unscaled, the mean
    is (k / d) x."""
    x, draws = torch.randn(20, generator=gen(2)).double(), 4000
    scaled, plain = RandomSparse(0.25, unbiased=True), RandomSparse(0.25)
    g = gen(9)
    mean = torch.stack([scaled.encode(x, {}, g).decoded for _ in range(draws)]).mean(0).numpy()
    error = np.abs(x.numpy()) * math.sqrt(20 / 5 - 1) / math.sqrt(draws)
    assert np.all(np.abs(mean - x.numpy()) < 5 * error)
    g = gen(9)
    biased = torch.stack([plain.encode(x, {}, g).decoded for _ in range(draws)]).mean(0).numpy()
    assert np.all(np.abs(biased - x.numpy() / 4) < 5 * error / 4)
    assert np.abs(biased - x.numpy()).max() > 10 * error.max()


def test_random_k_is_scaled_only_without_error_feedback():
    assert encoder_of(RandomK(kind="randomk", fraction=0.1, error_feedback=False)) == RandomSparse(0.1, True)
    fed_back = encoder_of(RandomK(kind="randomk", fraction=0.1))
    assert fed_back == ErrorFeedback(RandomSparse(0.1, False))
