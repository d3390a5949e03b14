"""The weight-averaging pieces against hand-built cases and plain references."""

import numpy as np
import pytest
import torch

from raysim.train.weight_averaging import (
    LossValley,
    RunningMean,
    Segment,
    greedy_soup,
    hold_back_for_selection,
    recompute_batchnorm,
    uniform_mean,
)
from raysim.types import ClientData


def data(n):
    return ClientData({"x": np.arange(n * 2, dtype=np.float32).reshape(n, 2), "y": np.arange(n)})


def test_the_validation_split_is_a_seeded_partition_of_the_client_data():
    def transform(batch, step):
        return batch

    whole = ClientData(data(10).arrays, batch_transform=transform)
    train, val = hold_back_for_selection(whole, 0.2, seed=4)
    assert len(train) == 8 and len(val) == 2
    assert sorted(np.concatenate([train.arrays["y"], val.arrays["y"]]).tolist()) == list(range(10))
    assert np.array_equal(train.arrays["x"][:, 0] / 2, train.arrays["y"])  # rows stay whole
    assert train.batch_transform is transform and val.batch_transform is None  # no augmentation on val
    again = hold_back_for_selection(whole, 0.2, seed=4)[1]
    assert np.array_equal(again.arrays["y"], val.arrays["y"])
    others = {tuple(hold_back_for_selection(whole, 0.2, seed=s)[1].arrays["y"]) for s in range(20)}
    assert len(others) > 5  # another client or round, another split


@pytest.mark.parametrize(("n", "fraction", "num_val"), [(2, 0.2, 1), (3, 0.9, 2), (100, 0.25, 25)])
def test_the_split_keeps_one_example_on_each_side(n, fraction, num_val):
    assert len(hold_back_for_selection(data(n), fraction, 0)[1]) == num_val


def test_a_client_with_one_example_has_nothing_to_hold_back():
    with pytest.raises(ValueError, match="1 example.*min_size"):
        hold_back_for_selection(data(1), 0.2, 0)


def test_the_running_mean_weighs_by_count():
    sets = [
        {"w": torch.tensor([1.0, 2.0])},
        {"w": torch.tensor([4.0, -1.0])},
        {"w": torch.tensor([0.5, 0.0])},
    ]
    counts = [1.0, 3.0, 2.0]
    average = RunningMean()
    for params, count in zip(sets, counts):
        average.add(params, count)
    expected = sum(c * np.array(s["w"]) for s, c in zip(sets, counts)) / sum(counts)
    assert np.allclose(average.mean()["w"].numpy(), expected) and average.mean()["w"].dtype == torch.float32
    assert torch.equal(uniform_mean(sets)["w"], torch.tensor([5.5 / 3, 1.0 / 3]))


def test_the_greedy_soup_visits_the_best_first_and_keeps_what_does_not_lower_accuracy():
    """Ingredients by own accuracy: 1 (0.9), 2 (0.7), 3 (0.6), 0 (0.5). Soup {1, 2} scores 0.92:
    kept; {1, 2, 3} 0.85: dropped; {1, 2, 0} 0.92, equal: kept (Recipe 1's >=)."""
    table = {(1, 2): 0.92, (1, 2, 3): 0.85, (1, 2, 0): 0.92}
    asked = []

    def soup_accuracy(members):
        asked.append(tuple(members))
        return table[tuple(members)]

    assert greedy_soup([0.5, 0.9, 0.7, 0.6], soup_accuracy) == [1, 2, 0]
    assert asked == [(1, 2), (1, 2, 3), (1, 2, 0)]
    assert greedy_soup([0.8], soup_accuracy) == [0]


def reference_window(losses, start_window, end_window, tolerance):
    """Cha et al. sec. 3.3 over the whole sequence (windows cut at its end): the averaged range."""
    k = len(losses)
    s = next(j for j in range(k) if losses[j] <= min(losses[j : j + start_window]))
    threshold = tolerance * losses[s]
    e = next((j for j in range(s, k) if min(losses[j : j + end_window]) > threshold), k)
    return list(range(s, e))


def feed(losses, start_window, end_window, tolerance, counts=None):
    valley = LossValley(start_window, end_window, tolerance)
    counts = counts or [1] * len(losses)
    for i, (loss, count) in enumerate(zip(losses, counts)):
        valley.add(Segment(i, {"w": torch.tensor([float(i)])}, count, loss))
    return valley, valley.finish()


def test_the_loss_valley_on_a_hand_built_curve():
    """N_s = 3, N_e = 3, r = 1.3. The loss falls to 3.0 at evaluation 2, the lowest of 2..4: the
    start; threshold 3.9. From 8 on, 4.5, 4.6, 4.7 all exceed it: the end. The late dip to 3.0
    comes after the valley died and is ignored. Segment i's mean is i, with i + 1 iterates."""
    losses = [5.0, 4.0, 3.0, 3.5, 3.2, 2.9, 3.0, 3.1, 4.5, 4.6, 4.7, 4.8, 3.0]
    counts = [i + 1 for i in range(len(losses))]
    valley, mean = feed(losses, 3, 3, 1.3, counts)
    assert valley.start == 2 and valley.end == 8 and valley.averaged == [2, 3, 4, 5, 6, 7]
    expected = sum(i * (i + 1) for i in range(2, 8)) / sum(i + 1 for i in range(2, 8))
    assert mean["w"].item() == pytest.approx(expected)


def test_windows_past_the_end_of_training_are_cut_there():
    """A loss still falling when training ends: the last evaluation is the lowest of what is left."""
    valley, mean = feed([3.0, 2.0, 1.0], 3, 6, 1.3)
    assert valley.start == 2 and valley.averaged == [2] and mean["w"].item() == 2.0
    assert feed([], 3, 6, 1.3)[1] is None


@pytest.mark.parametrize("seed", range(40))
def test_the_streaming_valley_matches_the_definition_on_random_curves(seed):
    rng = np.random.default_rng(seed)
    losses = np.cumsum(rng.normal(0, 1, rng.integers(1, 30))) + 20
    start_window, end_window = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    valley, _ = feed(losses.tolist(), start_window, end_window, 1.05)
    assert valley.averaged == reference_window(losses.tolist(), start_window, end_window, 1.05)


def test_batchnorm_statistics_are_recomputed_at_the_current_weights():
    """One pass in one batch: the running mean and (unbiased) variance are the data's."""
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(2))
    x = np.array([[1.0, 2.0], [3.0, -2.0], [5.0, 0.0]], np.float32)
    assert recompute_batchnorm(model, ClientData({"x": x, "y": np.zeros(3)}), 8, "cpu")
    bn = model[0]
    assert np.allclose(bn.running_mean.numpy(), x.mean(0)) and np.allclose(
        bn.running_var.numpy(), x.var(0, ddof=1)
    )
    assert bn.momentum == 0.1 and model.training  # update_bn restores both
    assert not recompute_batchnorm(torch.nn.Linear(2, 2), ClientData({"x": x}), 8, "cpu")
