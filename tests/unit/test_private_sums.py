"""Central DP's sums (raysim/private_sums.py) against hand-computed values.

Derivation. A client's contribution ``u`` (every summed tensor, jointly) enters the sum as
``w * min(1, C / ||u||) * u`` with ``w`` 1, or ``min(n / cap, 1)``; the noise is added once to the
merged sums; the aggregate divides by a fixed denominator ``D``. So for FedAvg (``WeightedMean``)
the released mean is ``(sum_i w_i clip(u_i) + z) / D``; for FedFish every one of its three sums
(``F*delta``, ``F``, ``delta``) is scaled by the same factor, from their joint norm.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.aggregate import Gather, Sum, Summing, WeightedMean
from raysim.private_sums import (
    ClientClipping,
    ClippedSums,
    add_noise,
    client_weight,
    gaussian_draws,
    released,
)
from raysim.types import ClientResult


def result(values: dict[str, list[float]], weight: float = 1.0) -> ClientResult:
    return ClientResult({k: torch.tensor(v) for k, v in values.items()}, weight, {})


def fold(aggregator, results):
    acc = aggregator.zero()
    for position, r in enumerate(results):
        acc = aggregator.add(acc, position, r)
    return acc


def test_each_contribution_is_clipped_to_the_bound_jointly_over_its_tensors():
    big = result({"a": [3.0, 0.0], "b": [4.0]})  # norm 5 -> scaled by 1/5 for bound 1
    small = result({"a": [0.3, 0.0], "b": [0.4]})  # norm 0.5 -> unchanged
    acc = fold(ClippedSums(WeightedMean(), ClientClipping(clip_bound=1.0)), [big, small])
    expected = {"a": np.array([3 / 5 + 0.3, 0.0]), "b": np.array([4 / 5 + 0.4])}
    for key, value in expected.items():
        np.testing.assert_allclose(acc.sums.total[key].numpy(), value, rtol=1e-6)  # float32 inputs
    assert (int(acc.num_within_bound), acc.num_clients) == (1, 2)


def test_the_plugins_weights_are_replaced_by_uniform_or_capped_ones():
    clients = [result({"a": [0.1]}, weight=5.0), result({"a": [0.1]}, weight=40.0)]
    uniform = fold(ClippedSums(WeightedMean(), ClientClipping(1.0)), clients)
    capped = fold(ClippedSums(WeightedMean(), ClientClipping(1.0, weight_cap=10)), clients)
    assert uniform.sums.total["a"].item() == pytest.approx(0.2)
    assert capped.sums.total["a"].item() == pytest.approx(0.1 * 5 / 10 + 0.1 * 1.0)
    assert client_weight(5, 10) == 0.5 and client_weight(40, 10) == 1.0 and client_weight(40, None) == 1.0


def test_no_clipped_contribution_exceeds_the_bound_whatever_its_size():
    rng = np.random.default_rng(0)
    aggregator = ClippedSums(WeightedMean(), ClientClipping(clip_bound=0.7))
    for scale in (1e-3, 1.0, 1e3):
        one = fold(aggregator, [result({"a": list(rng.normal(size=20) * scale)})])
        norm = float(np.linalg.norm(one.sums.total["a"].numpy()))
        assert norm <= 0.7 * (1 + 1e-12)
        if scale < 0.1:
            assert norm < 0.7  # below the bound: untouched


def test_partials_merge_as_one_worker_would_fold_them():
    clients = [result({"a": [float(i), 1.0 - i]}) for i in range(5)]
    aggregator = ClippedSums(WeightedMean(), ClientClipping(clip_bound=1.5))
    whole = fold(aggregator, clients)
    split = aggregator.merge(fold(aggregator, clients[:2]), fold(aggregator, clients[2:]))
    torch.testing.assert_close(whole.sums.total["a"], split.sums.total["a"], rtol=1e-12, atol=0)
    assert (int(whole.num_within_bound), whole.num_clients) == (
        int(split.num_within_bound),
        split.num_clients,
    )


def test_the_release_divides_the_noised_sum_by_the_fixed_denominator():
    acc = fold(
        ClippedSums(WeightedMean(), ClientClipping(10.0)), [result({"a": [1.0]}), result({"a": [3.0]})]
    )
    noise = [torch.tensor([0.5], dtype=torch.float64)]
    mean = released(WeightedMean(), add_noise(acc.sums, noise), denominator=8.0)
    assert mean["a"].item() == pytest.approx((1.0 + 3.0 + 0.5) / 8.0)  # not / 2, the clients that came


def test_the_noise_has_the_asked_standard_deviation_and_is_seeded():
    acc = fold(ClippedSums(WeightedMean(), ClientClipping(1.0)), [result({"a": [0.0] * 200_000})])

    def noised(seed: int) -> np.ndarray:
        draws = gaussian_draws(acc.sums, torch.Generator().manual_seed(seed))
        return add_noise(acc.sums, [0.3 * draw for draw in draws]).total["a"].numpy()

    first, again = noised(7), noised(7)
    # the sample std of n normals has standard error std / sqrt(2n): 5 of them is a safe margin
    assert abs(first.std() - 0.3) < 5 * 0.3 / np.sqrt(2 * first.size)
    assert abs(first.mean()) < 5 * 0.3 / np.sqrt(first.size)
    np.testing.assert_array_equal(first, again)
    assert acc.sums.total["a"].abs().max() == 0  # the partial itself is not changed


def test_noise_of_the_wrong_shape_is_refused():
    acc = fold(ClippedSums(WeightedMean(), ClientClipping(1.0)), [result({"a": [1.0, 2.0]})])
    with pytest.raises(ValueError, match="noise of shapes"):
        add_noise(acc.sums, [torch.zeros(3)])


def test_only_aggregators_that_divide_a_weighted_sum_are_summing():
    assert isinstance(WeightedMean(), Summing)
    assert not isinstance(Sum(), Summing) and not isinstance(Gather(), Summing)
