"""The job's robust: and attack: sections (raysim/config/robust.py): each value the round cannot
honour is refused when the job is read, in one line naming the key and the fix."""

import pytest

from raysim.config import JobConfig, deep_merge
from raysim.config.robust import trimmed_count
from raysim.errors import ConfigError

BASE = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}


def refused(sections) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        JobConfig.from_dict(deep_merge(BASE, sections))
    return caught.value.problems


@pytest.mark.parametrize(
    "sections, says",
    [
        ({"robust": {"rule": "krum", "f": 4}}, "robust.f: krum needs a cohort of more than 2f + 2 = 10"),
        (
            {"robust": {"rule": "multi_krum", "f": 1, "m": 11}},
            "robust.m: averages the m best of the cohort's 10",
        ),
        ({"robust": {"rule": "multi_krum", "f": 1, "m": 0}}, "robust.multi_krum.m: Input should be greater"),
        ({"robust": {"rule": "trimmed_mean", "beta": 0.5}}, "robust.beta: trimming 0.5 of 10 from each side"),
        (
            {"robust": {"rule": "trimmed_mean", "beta": -0.1}},
            "robust.trimmed_mean.beta: Input should be greater",
        ),
        (
            {"robust": {"rule": "norm_bound", "max_norm": -1.0}},
            "robust.norm_bound.max_norm: Input should be greater",
        ),
        ({"robust": {"rule": "norm_bound", "max_norm": float("inf")}}, "max_norm: Input should be a finite"),
        ({"robust": {"rule": "centered_clip", "tau": float("nan")}}, "tau: Input should be a finite"),
        ({"robust": {"rule": "mean"}}, "robust: Input tag 'mean' found using 'rule' does not match"),
        (
            {"attack": {"kind": "sign_flip", "fraction": 1.0}},
            "attack.sign_flip.fraction: Input should be less than 1",
        ),
        ({"attack": {"kind": "scale", "fraction": -0.1}}, "attack.scale.fraction: Input should be greater"),
        (
            {"attack": {"kind": "gaussian", "fraction": 0.1, "sigma": 0}},
            "sigma: Input should be greater than 0",
        ),
        (
            {"robust": {"rule": "median"}, "algorithm": {"name": "scaffold"}},
            "robust: algorithm 'scaffold' aggregates with Sum, not a WeightedMean",
        ),
        (
            {"attack": {"kind": "alie", "fraction": 0.2}, "algorithm": {"name": "fedfish"}},
            "attack: algorithm 'fedfish' aggregates with FisherWeightedMean",
        ),
        (
            {"robust": {"rule": "median"}, "algorithm": {"name": "fusefl"}},
            "aggregates with Gather",
        ),
        (
            {
                "robust": {"rule": "median"},
                "privacy": {"central": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5},
            },
            "robust: a robust rule reads every update, central DP releases only their noised sum",
        ),
        (
            {"attack": {"kind": "label_flip", "fraction": 0.1}, "engine": {"vectorize": "on"}},
            "attack: label_flip changes the malicious clients' batches",
        ),
    ],
)
def test_what_a_robust_round_cannot_honour_is_refused_in_one_line(sections, says):
    problems = refused(sections)
    assert len(problems) == 1 and says in problems[0], problems


def test_the_largest_f_krum_allows_and_a_label_flip_on_any_plugin_are_read():
    job = JobConfig.from_dict(deep_merge(BASE, {"robust": {"rule": "krum", "f": 3}}))
    assert (
        job.robust is not None
        and job.robust.f == 3
        and job.to_dict()["robust"] == {"rule": "krum", "f": 3, "device": "auto", "memory_mb": None}
    )
    flip = {"attack": {"kind": "label_flip", "fraction": 0.2}, "algorithm": {"name": "scaffold"}}
    assert JobConfig.from_dict(deep_merge(BASE, flip)).attack.kind == "label_flip"


def test_a_job_without_robust_or_attack_reads_as_before():
    config = JobConfig.from_dict(BASE).to_dict()
    assert "robust" not in config and "attack" not in config


@pytest.mark.parametrize(("beta", "n", "count"), [(0.29, 100, 29), (0.57, 100, 57), (0.1, 7, 0), (0.5, 9, 4)])
def test_the_trimmed_count_is_floor_beta_n_despite_float_error(beta, n, count):
    """By hand: 0.29 * 100 and 0.57 * 100 fall a hair below 29 and 57 in floating point."""
    assert trimmed_count(beta, n) == count


def test_where_a_rule_runs_changes_neither_a_resume_nor_the_noise():
    """Checkpoints written before robust.device and robust.memory_mb resume; a run may move."""
    from raysim.config.job import noise_salt
    from raysim.tracking.lineage import config_changes

    job = JobConfig.from_dict(deep_merge(BASE, {"robust": {"rule": "median"}}))
    saved = job.to_dict()
    saved["robust"] = {"rule": "median"}  # as written before the two settings
    moved = JobConfig.from_dict(
        deep_merge(BASE, {"robust": {"rule": "median", "device": "cpu", "memory_mb": 64}})
    )
    assert config_changes(saved, moved.to_dict()) == []
    assert noise_salt(job) == noise_salt(moved)
