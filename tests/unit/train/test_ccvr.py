"""CCVR against hand computations: pooled class Gaussians equal numpy's over all features, the
virtual features follow them, one calibration step is the hand-written softmax gradient, and the
server's whole step turns a head that cannot tell two classes apart into one that can. The draws
are a function of the covariance alone: float32 and float64 features draw alike."""

import numpy as np
import torch

from raysim.train.ccvr import (
    CCVRConfig,
    calibrate_head,
    calibrated_head,
    class_statistics,
    pooled_gaussians,
    virtual_features,
)


def test_pooled_statistics_are_the_means_and_covariances_of_all_features():
    rng = np.random.default_rng(0)
    f1, y1 = rng.normal(size=(9, 3)), np.array([0, 1, 0, 1, 0, 0, 1, 1, 0])
    f2, y2 = rng.normal(size=(5, 3)) + 2.0, np.array([1, 1, 0, 1, 2])
    stats = [class_statistics(torch.tensor(f), torch.tensor(y), 4) for f, y in ((f1, y1), (f2, y2))]
    means, covs, count = pooled_gaussians(stats)
    f, y = np.concatenate([f1, f2]), np.concatenate([y1, y2])
    for c in (0, 1):
        np.testing.assert_allclose(means[c].numpy(), f[y == c].mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(
            covs[c].numpy(), np.cov(f[y == c], rowvar=False, ddof=1), rtol=1e-10, atol=1e-12
        )
    np.testing.assert_allclose(means[2].numpy(), f2[4])  # one example: its value, covariance zero
    assert torch.count_nonzero(covs[2]) == 0 and count.tolist() == [6.0, 7.0, 1.0, 0.0]


def test_virtual_features_follow_each_class_gaussian_even_a_singular_one():
    mean = torch.tensor([[1.0, -2.0], [0.0, 3.0]], dtype=torch.float64)
    covs = torch.tensor([[[2.0, 0.5], [0.5, 1.0]], [[1.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)  # rank 1
    x, y = virtual_features(
        mean, covs, torch.tensor([4.0, 4.0, 0.0]), 20000, torch.Generator().manual_seed(0)
    )
    assert x.shape == (40000, 2) and set(y.tolist()) == {0, 1}  # no draws of the unseen class
    for c in (0, 1):
        np.testing.assert_allclose(x[y == c].double().mean(0).numpy(), mean[c].numpy(), atol=0.05)
        np.testing.assert_allclose(
            np.cov(x[y == c].double().numpy(), rowvar=False), covs[c].numpy(), atol=0.06
        )
    diff = x[y == 1, 0] - x[y == 1, 1]  # the singular class lies on the line x0 - x1 = -3
    torch.testing.assert_close(diff, torch.full_like(diff, -3.0), atol=1e-4, rtol=0)


def test_one_calibration_step_is_the_hand_written_cross_entropy_gradient():
    head = torch.nn.Linear(3, 2)
    w0, b0 = head.weight.detach().clone(), head.bias.detach().clone()
    x, y = torch.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0], [0.0, 1.0, 1.0]]), torch.tensor([0, 1, 1])
    calibrate_head(head, x, y, lr=0.1, epochs=1, batch_size=3, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(x @ w0.T + b0, dim=1)
    residual = (p - torch.nn.functional.one_hot(y, 2)) / 3  # d mean CE / d logits
    torch.testing.assert_close(head.weight.detach(), w0 - 0.1 * residual.T @ x)
    torch.testing.assert_close(head.bias.detach(), b0 - 0.1 * residual.sum(0))


def test_the_servers_step_calibrates_a_blind_head_on_two_clients_statistics_and_leaves_it_unchanged():
    """Class 0 around (-3, 0), class 1 around (3, 0), one class per client; a zero head scores
    both alike (loss ln 2). After CCVR the head puts each class mean on its own side."""
    rng = np.random.default_rng(1)
    stats = [
        class_statistics(torch.tensor(rng.normal(size=(50, 2)) + [3.0 * s, 0.0]), torch.full((50,), c), 2)
        for c, s in ((0, -1), (1, 1))
    ]
    blind = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    config = CCVRConfig(samples_per_class=200, epochs=3, batch_size=32)
    head, loss = calibrated_head(blind, stats, 2, config, lr=0.5, seed=0)
    logits = torch.tensor([[-3.0, 0.0], [3.0, 0.0]]) @ head["weight"].T + head["bias"]
    assert logits.argmax(dim=1).tolist() == [0, 1] and loss < np.log(2)
    assert not blind["weight"].any()  # the head passed in stays as it was
    again, _ = calibrated_head(blind, stats, 2, config, lr=0.5, seed=0)
    assert all(torch.equal(again[k], head[k]) for k in head)  # a pure function of the seed


def polygon_features(dtype):
    """Twelve points of one class whose covariance is exactly diag(a, a, b) in exact arithmetic: the
    first two axes share one eigenvalue, so their eigenvectors are any basis of that plane, and the
    rounding of float32 features picks another one than float64's."""
    t = np.arange(12) * 2 * np.pi / 12
    f = np.stack([np.cos(t), np.sin(t), 0.5 * np.cos(2 * t)], axis=1) * 3.0 + 1.0
    return torch.tensor(f).to(dtype)


def draws_of(features, labels, num_classes, per_class=100):
    means, covs, count = pooled_gaussians([class_statistics(features, labels, num_classes)])
    return virtual_features(means, covs, count, per_class, torch.Generator().manual_seed(0))[0]


def test_draws_do_not_depend_on_the_eigenvectors_signs_or_basis(monkeypatch):
    """Sigma^(1/2) z with the symmetric root: features rounded to float32 draw what float64 ones
    draw, to round-off (an eigenvector root V sqrt(L) moved them by up to 13); and flipping the signs
    of the eigenvectors eigh returns leaves every draw as it was."""
    labels = torch.zeros(12, dtype=torch.int64)
    x64, x32 = (
        draws_of(polygon_features(torch.float64), labels, 1),
        draws_of(polygon_features(torch.float32), labels, 1),
    )
    torch.testing.assert_close(x32, x64, atol=1e-5, rtol=0)
    eigh = torch.linalg.eigh

    def flipped(matrix):
        values, vectors = eigh(matrix)
        return values, vectors * torch.tensor([-1.0, 1.0, -1.0], dtype=vectors.dtype)

    monkeypatch.setattr(torch.linalg, "eigh", flipped)
    torch.testing.assert_close(draws_of(polygon_features(torch.float64), labels, 1), x64, atol=1e-6, rtol=0)


def test_a_calibrated_head_from_float32_features_is_the_float64_ones():
    """The server's whole step on two clients' statistics of the same features, computed in float32
    and in float64: the heads agree to round-off, where eigenvector roots moved them by 4e-2."""
    base = polygon_features(torch.float64)
    features = torch.cat([base, base * torch.tensor([-1.0, 1.0, 2.0], dtype=torch.float64) + 4.0])
    labels = torch.cat([torch.zeros(12), torch.ones(12)]).long()
    config = CCVRConfig(samples_per_class=500, epochs=2, batch_size=50)
    start = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}
    heads = []
    for dtype in (torch.float32, torch.float64):
        f = features.to(dtype)
        stats = [class_statistics(f[i::2], labels[i::2], 2) for i in (0, 1)]
        heads.append(calibrated_head(start, stats, 2, config, lr=0.1, seed=0)[0])
    for name in start:
        torch.testing.assert_close(heads[0][name], heads[1][name], atol=1e-5, rtol=0)
