"""CCVR against hand computations: pooled class Gaussians equal numpy's over all features, the
virtual features follow them, one calibration step is the hand-written softmax gradient, and the
server's whole step turns a head that cannot tell two classes apart into one that can."""

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
