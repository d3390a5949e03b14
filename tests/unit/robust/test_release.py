"""The driver's release (raysim/robust/release.py): ALIE's rows written from the benign ones, the
rule applied, the tree rebuilt, the metrics of the round."""

from dataclasses import replace

import byzantine_reference as ref
import numpy as np
import pytest
from gathered_rows import round_output

from raysim.aggregate import WeightedMean
from raysim.config.robust import ALIE, CenteredClip, Krum, Median
from raysim.errors import CheckpointError, ConfigError
from raysim.gathered_updates import GatheredUpdates
from raysim.robust.release import RunRobust, check_resumable

ROWS = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
COHORT = np.array([10, 11, 12, 13, 14, 15])


def output(rows=ROWS):
    return round_output(rows)


def test_a_median_release_returns_the_tree_of_the_coordinate_wise_median():
    robust = RunRobust(Median(rule="median"), None, frozenset({11, 99}), attacked=True)
    released = robust.release(output(), COHORT, 0)
    np.testing.assert_allclose(released.aggregate["w"].numpy(), ref.median(ROWS), rtol=1e-6)
    assert robust.metrics() == {"attack/malicious_in_cohort": 1.0}


def test_alie_replaces_the_malicious_rows_before_a_mean():
    alie = ALIE(kind="alie", fraction=0.3)
    robust = RunRobust(None, alie, frozenset({12, 15}), attacked=True)
    released = robust.release(output(), COHORT, 0)
    benign = ROWS[[0, 1, 3, 4]].astype(np.float64)
    z = ref.alie_z(6, 2)
    attacker = benign.mean(0) - z * benign.std(0, ddof=1)
    expected = (benign.sum(0) + 2 * attacker) / 6
    np.testing.assert_allclose(released.aggregate["w"].numpy(), expected, rtol=1e-5)
    assert robust.metrics()["attack/alie_z"] == pytest.approx(z)


def test_centered_clipping_starts_from_the_previous_aggregate():
    robust = RunRobust(CenteredClip(rule="centered_clip", tau=0.5), None, frozenset(), attacked=False)
    first = robust.release(output(), COHORT, 0).aggregate["w"].numpy()
    second = robust.release(output(), COHORT, 1).aggregate["w"].numpy()
    np.testing.assert_allclose(first, ref.centered_clip(ROWS, np.zeros(3), 0.5, 1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(second, ref.centered_clip(ROWS, first, 0.5, 1), rtol=1e-5, atol=1e-7)
    assert "attack/malicious_in_cohort" not in robust.metrics()


def test_a_round_with_too_few_updates_for_krum_says_so_in_one_line():
    robust = RunRobust(Krum(rule="krum", f=2), None, frozenset(), attacked=False)
    with pytest.raises(ConfigError, match="round 4 has 6 updates"):
        robust.release(output(), COHORT, 4)


def test_an_empty_round_has_no_aggregate():
    robust = RunRobust(Median(rule="median"), None, frozenset(), attacked=False)
    empty = replace(output(), aggregate=GatheredUpdates(WeightedMean()).zero())
    assert robust.release(empty, COHORT, 0).aggregate is None


def test_resuming_centered_clipping_from_the_previous_aggregate_is_refused_but_a_zero_start_resumes():
    """The previous aggregate is not in checkpoints: a resumed round would start from zero instead."""
    previous = CenteredClip(rule="centered_clip", tau=1.0)
    check_resumable(previous, 0)  # a fresh run
    check_resumable(CenteredClip(rule="centered_clip", tau=1.0, start="zero"), 3)
    check_resumable(Median(rule="median"), 3)
    with pytest.raises(CheckpointError, match="start: zero"):
        check_resumable(previous, 3)
