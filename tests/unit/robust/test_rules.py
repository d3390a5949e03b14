"""The robust rules (raysim/robust/rules.py) against the numpy references in byzantine_reference.py,
chunked as unchunked."""

import byzantine_reference as ref
import numpy as np
import pytest
import torch

from raysim.robust import rules

RNG = np.random.default_rng(0)
X = RNG.normal(size=(7, 11))  # 7 updates of 11 values
X[5] += 40.0  # two outliers
X[6] -= 25.0
WEIGHTS = np.array([1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 2.0])


def tensor(x=X):
    return torch.tensor(x, dtype=torch.float32)


@pytest.mark.parametrize("n", [6, 7])  # even: the mean of the two middle values
def test_median_is_numpys(n):
    out, _ = rules.median(tensor(X[:n]), chunk=4)
    np.testing.assert_allclose(out.numpy(), ref.median(X[:n].astype(np.float32)), rtol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.3, 0.5])
def test_trimmed_mean_drops_floor_beta_n_from_each_side(beta):
    out, metrics = rules.trimmed_mean(tensor(), beta, chunk=3)
    np.testing.assert_allclose(
        out.numpy(), ref.trimmed_mean(X.astype(np.float32), beta), rtol=1e-5, atol=1e-6
    )
    assert metrics["robust/trimmed"] == 2 * int(beta * 7)


def test_trimmed_mean_drops_the_intended_count_where_beta_n_is_a_hair_below_it():
    """0.29 * 100 is 28.999999999999996 in floating point: 29 dropped from each side, by hand."""
    x = np.random.default_rng(1).normal(size=(100, 3))
    out, metrics = rules.trimmed_mean(tensor(x), 0.29, chunk=2)
    assert metrics["robust/trimmed"] == 58
    np.testing.assert_allclose(out.numpy(), np.sort(x, axis=0)[29:71].mean(0), rtol=1e-5, atol=1e-6)


def test_trimming_half_of_an_even_cohort_is_refused():
    with pytest.raises(ValueError, match="leaves none"):
        rules.trimmed_mean(tensor(X[:6]), 0.5, chunk=3)


def test_krum_chooses_the_reference_row_and_multi_krum_averages_the_m_best():
    for f, m in [(1, 1), (2, 1), (1, 3), (2, 5)]:
        expected, chosen = ref.multi_krum(X.astype(np.float32), f, m)
        out, metrics = rules.krum_mean(tensor(), f, m, chunk=4)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
        assert metrics["robust/selected"] == m
        assert 5 not in chosen and 6 not in chosen  # the outliers score worst


def test_krum_scores_are_the_references():
    scores = rules.krum_scores(rules.squared_distances(tensor(), chunk=2), f=2)
    np.testing.assert_allclose(scores.numpy(), ref.krum_scores(X.astype(np.float32), 2), rtol=1e-5)


def test_krum_refuses_a_cohort_of_at_most_2f_plus_2():
    with pytest.raises(ValueError, match="n > 2f"):
        rules.krum_mean(tensor(X[:6]), 2, 1, chunk=4)


def test_the_geometric_median_is_weiszfelds_fixed_point_and_beats_its_neighbours():
    nu = 1e-8
    out, metrics = rules.geometric_median(tensor(), torch.tensor(WEIGHTS), nu, 1000, 1e-12, chunk=4)
    v, alphas = out.numpy().astype(np.float64), WEIGHTS / WEIGHTS.sum()
    np.testing.assert_allclose(ref.weiszfeld_step(X, alphas, v, nu), v, atol=1e-4)
    best = ref.sum_of_distances(X, alphas, v)
    for step in np.eye(11) * 1e-2:
        assert best <= ref.sum_of_distances(X, alphas, v + step)
        assert best <= ref.sum_of_distances(X, alphas, v - step)
    assert 1 < metrics["robust/weiszfeld_iterations"] < 1000


def test_weiszfeld_stops_at_max_iterations():
    _, metrics = rules.geometric_median(tensor(), torch.tensor(WEIGHTS), 1e-8, 3, 0.0, chunk=4)
    assert metrics["robust/weiszfeld_iterations"] == 3


def test_weiszfeld_measures_the_distances_once_an_iteration(monkeypatch):
    """Each pass over the updates is one call: the start's, then one an iteration."""
    calls = []
    measure = rules.row_distances
    monkeypatch.setattr(rules, "row_distances", lambda *a: calls.append(1) or measure(*a))
    rules.geometric_median(tensor(), torch.tensor(WEIGHTS), 1e-8, 3, 0.0, chunk=4)
    assert len(calls) == 1 + 3


def test_norm_bounding_clips_each_update_then_takes_the_weighted_mean():
    out, metrics = rules.norm_bounded_mean(tensor(), torch.tensor(WEIGHTS), 5.0, chunk=4)
    expected = ref.norm_bounded_mean(X.astype(np.float32), WEIGHTS, 5.0)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    norms = np.linalg.norm(X, axis=1)
    assert metrics["robust/clipped_fraction"] == pytest.approx(np.mean(norms > 5.0))


@pytest.mark.parametrize("iterations", [1, 3])
def test_centered_clipping_is_the_references_iteration(iterations):
    start = RNG.normal(size=11)
    out, metrics = rules.centered_clip(tensor(), torch.tensor(start), 2.0, iterations, chunk=4)
    expected = ref.centered_clip(X.astype(np.float32), start, 2.0, iterations)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert 0 < metrics["robust/clipped_fraction"] <= 1


@pytest.mark.parametrize(
    "rule",
    [
        lambda x, c: rules.median(x, c),
        lambda x, c: rules.trimmed_mean(x, 0.2, c),
        lambda x, c: rules.krum_mean(x, 1, 3, c),
        lambda x, c: rules.geometric_median(x, torch.tensor(WEIGHTS), 1e-6, 50, 1e-9, c),
        lambda x, c: rules.norm_bounded_mean(x, torch.tensor(WEIGHTS), 5.0, c),
        lambda x, c: rules.centered_clip(x, torch.zeros(11), 2.0, 2, c),
    ],
)
def test_chunked_equals_unchunked(rule):
    whole, _ = rule(tensor(), 11)
    for chunk in (1, 3, 4):
        chunked, _ = rule(tensor(), chunk)
        torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)


def test_a_chunk_holds_the_budget_for_n_rows():
    assert rules.column_chunk(4, budget=100) == 25
    assert rules.column_chunk(1000, budget=100) == 1  # never below one coordinate
