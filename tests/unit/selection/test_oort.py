"""Oort's selection (raysim.selection.oort) against a numpy reference of the paper's utility written
here, and its behaviour over many rounds of a synthetic fleet."""

import math

import numpy as np
import pytest

from raysim.config.selection import OortSelection
from raysim.sampling import selection_rng
from raysim.selection.oort import Oort
from raysim.selection.selector import Feedback, choose

# client -> (examples, mean loss, round it last trained, its seconds)
HISTORY = {
    0: (50, 2.0, 0, 10.0),
    1: (20, 0.5, 1, 40.0),
    2: (80, 1.0, 2, 5.0),
    3: (10, 3.0, 2, 80.0),
    4: (40, 0.1, 0, 20.0),
    5: (500, 9.0, 1, 15.0),  # an outlier, clipped
}


def fed(config, history=HISTORY, speeds=None):
    oort = Oort(config, speeds)
    for round_num in sorted({last for _, _, last, _ in history.values()}):
        rows = [Feedback(c, n, loss, t) for c, (n, loss, last, t) in history.items() if last == round_num]
        oort.observe(round_num, rows)
    return oort


def reference_utility(history, clients, round_num, t_pref, alpha, clip_quantile):
    """Oort's Algorithm 1 as docs/systems.md states it: |B| x loss normalized as FedScale's oort
    get_norm does (clipped at the sorted one at index int(q n), then (u - 0.999 min) / (max - 0.999
    min), max unclipped), plus sqrt(0.1 log R / L) (rounds from 1), times (T / t) ** alpha when t > T."""
    stat = {c: n * loss for c, (n, loss, _, _) in history.items()}
    every = sorted(stat.values())
    clip = every[min(int(len(every) * clip_quantile), len(every) - 1)]
    low = 0.999 * every[0]
    span = max(every[-1] - low, 1e-4)
    out = []
    for c in clients:
        _, _, last, t = history[c]
        u = (min(stat[c], clip) - low) / span + math.sqrt(0.1 * math.log(round_num + 1) / (last + 1))
        out.append(u * (t_pref / t) ** alpha if t > t_pref else u)
    return np.array(out)


def test_the_utility_is_the_papers_clipped_statistical_utility_bonus_and_penalty():
    config = OortSelection(round_s=18.0, alpha=2.0)
    oort = fed(config)
    clients = np.arange(6)
    expected = reference_utility(HISTORY, clients, 7, 18.0, 2.0, 0.95)
    assert oort.utilities(clients, 7) == pytest.approx(expected)
    assert expected[1] < expected[0] and expected[3] < 0.5  # slow clients pay the penalty


def test_a_heavy_tail_is_clipped_at_the_sorted_utility_the_authors_code_takes():
    """40 clients of utility 1..39 and 1000: the clip is the sorted one at index int(0.95 * 40) =
    38, 39; scaled by hand, (min(u, 39) - 0.999) / (1000 - 0.999)."""
    history = {c: (1, float(c + 1), 0, None) for c in range(39)} | {39: (1, 1000.0, 0, None)}
    oort = fed(OortSelection(), history)
    bonus = math.sqrt(0.1 * math.log(6))
    expected = np.array([0.001, 38.001, 38.001]) / 999.001 + bonus
    assert oort.utilities(np.array([0, 38, 39]), 5) == pytest.approx(expected)


def test_equal_utilities_are_scaled_over_the_range_floor():
    history = {c: (10, 0.5, 0, None) for c in range(3)}  # 5 each: (5 - 4.995) / max(0.005, 1e-4)
    oort = fed(OortSelection(), history)
    assert oort.utilities(np.arange(3), 0) == pytest.approx(np.ones(3))


def test_without_durations_there_is_no_penalty():
    history = {c: (n, loss, last, None) for c, (n, loss, last, _) in HISTORY.items()}
    oort = fed(OortSelection(), history)
    assert oort.round_s is None
    no_penalty = reference_utility(
        {c: (*v[:3], 0.0) for c, v in history.items()}, range(6), 4, 1.0, 2.0, 0.95
    )
    assert oort.utilities(np.arange(6), 4) == pytest.approx(no_penalty)


def test_t_starts_at_the_30th_percentile_of_the_first_durations_and_the_pacer_raises_it():
    oort = Oort(OortSelection(window=2), None)
    oort.observe(0, [Feedback(c, 10, 1.0, float(t)) for c, t in enumerate([10, 20, 30, 40, 50])])
    assert oort.round_s == pytest.approx(np.percentile([10, 20, 30, 40, 50], 30))
    start = oort.round_s
    for r, loss in enumerate([1.0, 0.9, 0.5], start=1):  # utility falls: rounds 2-3 below 0-1
        oort.observe(r, [Feedback(0, 10, loss, 10.0)])
    assert oort.round_s == pytest.approx(start * 1.1)  # raised by one step, a tenth of its start


def test_epsilon_decays_by_its_factor_to_the_floor():
    oort = Oort(OortSelection(), None)
    assert oort.epsilon(0) == 0.9 and oort.epsilon(1) == pytest.approx(0.9 * 0.98)
    assert oort.epsilon(500) == 0.2


def test_a_round_exploits_explored_clients_and_explores_the_rest_by_speed():
    speeds = np.ones(20)
    speeds[10:] = [1e6] * 3 + [1e-6] * 7  # of the unexplored, 10-12 are fast
    oort = fed(OortSelection(epsilon=0.5, epsilon_min=0.5), speeds=speeds)  # clients 0-5 explored
    picked = choose(oort, np.arange(6, 20), 4, seed=0, round_num=3)
    assert {10, 11, 12} <= set(picked)  # none explored among 6-19: all four explore
    cohort = choose(oort, np.arange(20), 6, seed=0, round_num=3)
    assert len(set(cohort)) == 6 and len(set(cohort) & set(range(6))) == 3  # (1 - eps) * k exploited


def test_the_same_seed_and_history_give_the_same_cohort():
    config = OortSelection(round_s=18.0)
    a, b = fed(config), fed(config)
    assert list(choose(a, np.arange(30), 8, 5, 9)) == list(choose(b, np.arange(30), 8, 5, 9))
    assert list(a.select(np.arange(30), 8, 9, selection_rng(5, 9))) == list(choose(a, np.arange(30), 8, 5, 9))


def test_state_round_trips():
    oort = fed(OortSelection(window=1))
    again = Oort(OortSelection(window=1), None)
    again.restore(oort.state())
    assert again.state() == oort.state()
    assert list(choose(again, np.arange(12), 5, 1, 4)) == list(choose(oort, np.arange(12), 5, 1, 4))


def test_over_many_rounds_oort_favours_high_loss_fast_clients():
    """A fleet of 100: client c's loss is high for c % 2 == 0, its speed high for c % 4 < 2; the
    losses do not change, so the only lesson is who is useful and fast."""
    n, k = 100, 10
    clients = np.arange(n)
    loss = np.where(clients % 2 == 0, 2.0, 0.2)
    speed = np.where(clients % 4 < 2, 100.0, 10.0)
    oort, counts = Oort(OortSelection(), speed), np.zeros(n)
    for r in range(150):
        cohort = choose(oort, clients, k, seed=0, round_num=r)
        counts[cohort] += 1
        oort.observe(r, [Feedback(int(c), 50, float(loss[c]), 500 / speed[c]) for c in cohort])
    fast_useful = counts[(clients % 2 == 0) & (clients % 4 < 2)].mean()
    slow_useless = counts[(clients % 2 == 1) & (clients % 4 >= 2)].mean()
    uniform = 150 * k / n
    assert fast_useful > 1.5 * uniform > 3 * slow_useless
