"""Top-k and random-k (raysim/compress/sparse.py) against the numpy reference."""

from __future__ import annotations

import torch
from encoder_inputs import distinct, gen
from encoder_reference import top_k_indices

from raysim.compress.codec import ErrorFeedback
from raysim.compress.sparse import RandomSparse, TopSparse, index_bits, num_kept


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
