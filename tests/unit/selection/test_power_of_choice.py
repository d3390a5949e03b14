"""rpow-d (raysim.selection.power_of_choice) against a numpy reference written here: d candidates
drawn by data size from the round's selection stream, the k with the highest last reported loss,
clients never seen first."""

import numpy as np

from raysim.selection.power_of_choice import PowerOfChoice
from raysim.selection.selector import Feedback, choose

SIZES = np.array([10, 200, 30, 40, 500, 60, 70, 80, 90, 100], dtype=float)
LOSSES = {0: 0.3, 1: 2.5, 2: 0.1, 4: 1.7, 5: 0.9, 7: 3.0, 8: 0.2}  # 3, 6 and 9 never trained


def reference_cohort(candidates, k, d, seed, round_num):
    rng = np.random.default_rng([seed, round_num, 9])  # raysim.sampling's selection tag
    p = SIZES[candidates] / SIZES[candidates].sum()
    drawn = candidates[rng.choice(len(candidates), size=d, replace=False, p=p)]
    unseen = [int(c) for c in drawn if int(c) not in LOSSES]
    seen = sorted((int(c) for c in drawn if int(c) in LOSSES), key=lambda c: -LOSSES[c])
    return (unseen + seen)[:k]


def fed(d):
    selector = PowerOfChoice(d, SIZES)
    selector.observe(0, [Feedback(c, SIZES[c], loss) for c, loss in LOSSES.items()])
    return selector


def test_the_cohort_is_the_references_for_many_rounds():
    candidates = np.arange(10)
    for round_num in range(20):
        got = choose(fed(6), candidates, 3, seed=4, round_num=round_num)
        assert list(got) == reference_cohort(candidates, 3, 6, 4, round_num)


def test_d_defaults_to_twice_the_cohort_and_is_never_below_it():
    candidates = np.arange(2, 10)
    assert list(choose(fed(None), candidates, 2, 1, 3)) == reference_cohort(candidates, 2, 4, 1, 3)
    assert list(choose(fed(2), candidates, 5, 1, 3)) == reference_cohort(candidates, 5, 5, 1, 3)


def test_the_latest_loss_counts_and_state_round_trips():
    selector = fed(10)
    selector.observe(1, [Feedback(7, 80, 0.0)])  # 7 was the highest; now the lowest
    assert 7 not in choose(selector, np.arange(10), 6, 0, 2)
    again = PowerOfChoice(10, SIZES)
    again.restore(selector.state())
    assert again.loss == selector.loss
