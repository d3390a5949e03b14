"""The server's broadcast encoded (raysim/compress/downlink.py): the public model x̂ against a numpy
reference over several rounds, x̂ + e == x_t after each, the exact bytes, the shared draws, and
a downlink restored from its saved state."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from encoder_reference import downlink_rounds, power_step, scaled_sign, top_k

from raysim.compress.codec import ErrorFeedback
from raysim.compress.downlink import Downlink
from raysim.compress.lowrank import LowRank
from raysim.compress.quantize import Quantized, Sign
from raysim.compress.sparse import RandomSparse, TopSparse
from raysim.sampling import download_seed
from raysim.types import Payload

ROUNDS = 5


def models(seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The server's model over ``ROUNDS`` rounds: integers below 2^35 in float64, so every sum
    and difference the downlink makes is exact; a step counter travels as an integer."""
    rng = np.random.default_rng(seed)
    x = {"w": rng.integers(-(2**30), 2**30, (8, 12)).astype(np.float64), "b": np.zeros(8)}
    out = []
    for t in range(ROUNDS):
        out.append(x | {"n": np.array([t], dtype=np.int64)})
        x = {k: v + rng.integers(-(2**30), 2**30, v.shape) for k, v in x.items()}
    return out


def broadcast(downlink: Downlink, rounds: list[dict[str, np.ndarray]], first: int = 0) -> list[Payload]:
    return [downlink.send(Payload(x), first + t) for t, x in enumerate(rounds)]


def residual(downlink: Downlink, name: str) -> np.ndarray:
    return downlink.memory[name]["residual"].numpy()


def test_top_k_public_model_follows_the_reference_and_public_plus_residual_is_the_model():
    rounds = models()
    downlink = Downlink(ErrorFeedback(TopSparse(0.25)), seed=0)
    reference = {
        k: downlink_rounds([x[k] for x in rounds], lambda v: top_k(v, round(v.size / 4))) for k in "wb"
    }
    for t, x in enumerate(rounds):
        sent = downlink.send(Payload(x), t)
        for name in "wb":
            public, e = reference[name][t]
            assert np.array_equal(sent.params[name], public), (t, name)
            assert np.array_equal(residual(downlink, name), e), (t, name)
            assert np.array_equal(sent.params[name] + residual(downlink, name), x[name])  # x̂ + e == x_t
        assert np.array_equal(sent.params["n"], x["n"])  # integers travel whole
        # w: k = 24 float64 values + 24 indices of 7 bits; b: k = 2 values + 2 indices of 3 bits; n whole
        assert sent.params_bytes == (24 * 8 + math.ceil(24 * 7 / 8)) + (2 * 8 + 1) + 8


def test_scaled_sign_public_model_follows_the_reference():
    rounds = models(1)
    sent = broadcast(Downlink(ErrorFeedback(Sign()), seed=0), rounds)
    reference = downlink_rounds([x["w"] for x in rounds], scaled_sign)
    for t, x in enumerate(rounds):
        np.testing.assert_allclose(sent[t].params["w"], reference[t][0], rtol=1e-12)
        assert sent[t].params_bytes == (96 // 8 + 4) + (1 + 4) + 8  # a bit each and a float32 scale


def test_random_k_draws_are_a_pure_function_of_the_seed_and_round_that_clients_repeat():
    rounds = models(2)
    downlink = Downlink(ErrorFeedback(RandomSparse(0.25)), seed=7)
    public = rounds[0]  # what the clients hold before round 0
    for t, x in enumerate(rounds):
        sent = downlink.send(Payload(x), t)
        # a client seeds a generator with (seed, round) and draws w's coordinates, then b's
        generator = torch.Generator().manual_seed(download_seed(7, t))
        chosen_w = torch.randperm(96, generator=generator)[:24].numpy()
        chosen_b = torch.randperm(8, generator=generator)[:2].numpy()
        for name, chosen in (("w", chosen_w), ("b", chosen_b)):
            unchanged = np.setdiff1d(np.arange(x[name].size), chosen)
            assert np.array_equal(sent.params[name].ravel()[unchanged], public[name].ravel()[unchanged])
            assert np.array_equal(sent.params[name] + residual(downlink, name), x[name])
        assert sent.params_bytes == 24 * 8 + 2 * 8 + 8  # values only: the indices come from the seed
        public = sent.params


def test_qsgd_without_error_feedback_sends_each_change_alone():
    rounds = models(3)
    downlink = Downlink(Quantized(2, 0), seed=0)  # one norm: the reference below
    sent = broadcast(downlink, rounds)
    assert downlink.memory == {"w": {}, "b": {}}  # nothing kept: x̂ drifts from the model
    for t in range(1, ROUNDS):
        change = rounds[t]["w"] - rounds[t - 1]["w"]
        step = sent[t].params["w"] - sent[t - 1].params["w"]
        levels = np.abs(step) / np.linalg.norm(change) * 3  # s = 2^2 - 1: whole levels around |Δ_i|
        scaled = np.abs(change) / np.linalg.norm(change) * 3
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-6)
        level = np.round(levels)
        assert np.all(level >= np.floor(scaled)) and np.all(level <= np.ceil(scaled))
        assert np.all(np.sign(step)[step != 0] == np.sign(change)[step != 0])
        assert sent[t].params_bytes == math.ceil(96 * 3 / 8) + 4 + math.ceil(8 * 3 / 8) + 4 + 8


def test_powersgd_runs_one_power_step_on_the_q_the_server_kept():
    rounds = models(4)
    downlink = Downlink(ErrorFeedback(LowRank(2)), seed=0)
    sent = broadcast(downlink, rounds[:2])
    q, e = downlink.memory["w"]["q"].numpy(), residual(downlink, "w")
    after = downlink.send(Payload(rounds[2]), 2)
    decoded, _ = power_step(rounds[2]["w"] - rounds[1]["w"] + e, q)
    np.testing.assert_allclose(after.params["w"] - sent[1].params["w"], decoded, rtol=1e-9, atol=1e-3)
    np.testing.assert_allclose(after.params["w"] + residual(downlink, "w"), rounds[2]["w"], rtol=1e-12)
    assert after.params_bytes == (8 + 12) * 2 * 8 + 8 * 8 + 8  # P and Q of w; b and n whole


@pytest.mark.parametrize("inner", [RandomSparse(0.3), LowRank(1), Quantized(3, 0)])
def test_a_downlink_restored_from_its_saved_state_sends_what_the_uninterrupted_one_sends(inner):
    rounds = models(5)
    whole = broadcast(Downlink(ErrorFeedback(inner), seed=3), rounds)
    first = Downlink(ErrorFeedback(inner), seed=3)
    broadcast(first, rounds[:2])
    saved = io.BytesIO()
    torch.save(first.state(), saved)  # as the checkpoint holds it: tensors and plain containers
    resumed = Downlink(ErrorFeedback(inner), seed=3)
    resumed.restore(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    for a, b in zip(whole[2:], broadcast(resumed, rounds[2:], first=2), strict=True):
        assert a.params_bytes == b.params_bytes
        assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
