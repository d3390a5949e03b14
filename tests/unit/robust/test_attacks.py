"""Malicious clients (raysim/robust/attacks.py): a pure function of the seed; their updates'
transforms; ALIE's z and vector against byzantine_reference.py."""

import byzantine_reference as ref
import numpy as np
import pytest
import torch

from raysim.config.robust import Gaussian, Scale, SignFlip
from raysim.robust.attacks import (
    alie_vector,
    alie_z,
    attacked_result,
    attacked_update,
    flip_label_table,
    malicious_clients,
)
from raysim.types import ClientResult

POOL = np.arange(3, 103)  # 100 training clients


def test_the_malicious_set_is_a_pure_function_of_the_seed():
    first = malicious_clients(POOL, 0.3, seed=5)
    assert np.array_equal(first, malicious_clients(POOL, 0.3, seed=5))
    assert not np.array_equal(first, malicious_clients(POOL, 0.3, seed=6))
    assert len(first) == 30 and set(first) <= set(POOL) and np.all(np.diff(first) > 0)
    assert len(malicious_clients(POOL, 0.0, seed=5)) == 0
    assert set(malicious_clients(POOL, 0.1, seed=5)) <= set(malicious_clients(POOL, 0.3, seed=5))


@pytest.mark.parametrize(("fraction", "count"), [(0.25, 3), (0.35, 4), (0.45, 5), (0.3, 3), (0.24, 2)])
def test_the_malicious_count_rounds_half_up(fraction, count):
    """floor(fraction * 10 + 0.5), by hand: 2.5 -> 3, 3.5 -> 4, 4.5 -> 5 (not to the even 2, 4, 4)."""
    assert len(malicious_clients(np.arange(10), fraction, seed=0)) == count


def tree():
    return {"w": torch.tensor([[1.0, -2.0]]), "steps": torch.tensor([3])}  # an integer leaf is kept


def test_sign_flipping_and_scaling_change_the_float_tensors_only():
    flipped = attacked_update(tree(), SignFlip(kind="sign_flip", fraction=0.1, scale=2.0), 0)
    assert torch.equal(flipped["w"], torch.tensor([[-2.0, 4.0]])) and torch.equal(
        flipped["steps"], torch.tensor([3])
    )
    boosted = attacked_update(tree(), Scale(kind="scale", fraction=0.1, boost=10.0), 0)
    assert torch.equal(boosted["w"], torch.tensor([[10.0, -20.0]]))


def test_a_gaussian_attacker_sends_seeded_noise_of_its_sigma():
    attack = Gaussian(kind="gaussian", fraction=0.1, sigma=3.0)
    big = {"w": torch.zeros(20000)}
    noise = attacked_update(big, attack, seed=1)["w"]
    assert noise.std().item() == pytest.approx(3.0, rel=0.03) and abs(noise.mean().item()) < 0.1
    assert torch.equal(noise, attacked_update(big, attack, seed=1)["w"])
    result = ClientResult(big, 1.0)
    a = attacked_result(result, attack, 0, round_num=2, client_id=7).update["w"]
    assert not torch.equal(a, attacked_result(result, attack, 0, round_num=3, client_id=7).update["w"])


@pytest.mark.parametrize("n,f", [(50, 24), (20, 6), (10, 1), (7, 3)])
def test_alies_z_is_the_papers(n, f):
    assert alie_z(n, f) == pytest.approx(ref.alie_z(n, f), rel=1e-9)


def test_alies_z_for_the_papers_example():
    assert alie_z(50, 24) == pytest.approx(1.75, abs=0.01)  # n=50, f=24: z_max ~ 1.75


def test_alies_vector_is_the_benign_mean_less_z_stds():
    benign = np.random.default_rng(0).normal(size=(5, 4))
    out = alie_vector(torch.tensor(benign, dtype=torch.float32), z=1.5)
    np.testing.assert_allclose(out.numpy(), benign.mean(0) - 1.5 * benign.std(0, ddof=1), rtol=1e-5)


def test_the_label_table_flips_to_c_minus_1_minus_y_or_follows_a_mapping():
    assert flip_label_table(4, None).tolist() == [3, 2, 1, 0]
    assert flip_label_table(4, {1: 3, 2: 0}).tolist() == [0, 3, 0, 3]
