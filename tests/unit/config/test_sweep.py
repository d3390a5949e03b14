"""The sweep section: cells expanded in order against hand-listed cells, random draws a pure
function of the sweep's seed, ``--only`` filters, names and tags, and each bad input one error."""

import math

import numpy as np
import pytest
import yaml

from raysim.config.sweep import (
    Cell,
    as_yaml,
    draw_samples,
    expand_cells,
    parse_only,
    parse_sweep,
    select,
    sweep_id,
)
from raysim.errors import ConfigError


def test_cells_are_variants_by_grid_points_by_seeds_the_seed_fastest():
    spec = parse_sweep(
        {"seeds": [0, 1], "grid": {"algorithm.local.lr": [0.01, 0.1], "engine.cohort_size": [5]}}
    )
    cells = expand_cells(spec, {"fedavg": 7, "fedprox": 7})
    lr, cohort = "algorithm.local.lr", "engine.cohort_size"
    expected = [
        Cell(variant, seed, ((lr, value), (cohort, 5)))
        for variant in ("fedavg", "fedprox")
        for value in (0.01, 0.1)
        for seed in (0, 1)
    ]
    assert cells == expected
    assert [c.name for c in cells[:3]] == [
        "fedavg_lr0.01_cohort_size5_seed0",
        "fedavg_lr0.01_cohort_size5_seed1",
        "fedavg_lr0.1_cohort_size5_seed0",
    ]
    assert cells[0].label == "fedavg lr=0.01 cohort_size=5 seed=0"


def test_without_seeds_each_variant_keeps_its_jobs_seed():
    cells = expand_cells(parse_sweep({"grid": {"algorithm.local.lr": [0.1]}}), {"a": 3, "b": 5})
    assert [(c.variant, c.seed) for c in cells] == [("a", 3), ("b", 5)]


def test_random_axes_are_a_pure_function_of_the_sweeps_seed():
    raw = {
        "random": {
            "samples": 3,
            "axes": {
                "algorithm.local.lr": {"log_uniform": [0.001, 0.1]},
                "algorithm.local.momentum": {"uniform": [0.0, 0.9]},
                "algorithm.local.optimizer": {"choice": ["sgd", "adam"]},
            },
        },
        "seed": 4,
    }
    draws = draw_samples(parse_sweep(raw))
    assert draws == draw_samples(parse_sweep(raw))  # the same on every call
    assert draws != draw_samples(parse_sweep({**raw, "seed": 5}))
    rng = np.random.default_rng(4)  # the same draws, in the documented order, by hand
    for sample in draws:
        lr = math.exp(rng.uniform(math.log(0.001), math.log(0.1)))
        momentum = rng.uniform(0.0, 0.9)
        optimizer = ["sgd", "adam"][int(rng.integers(2))]
        assert dict(sample) == {
            "algorithm.local.lr": lr,
            "algorithm.local.momentum": momentum,
            "algorithm.local.optimizer": optimizer,
        }
    cells = expand_cells(parse_sweep({**raw, "seeds": [0, 1]}), {"fedavg": 0, "fedprox": 0})
    assert len(cells) == 2 * 3 * 2
    assert [c.drawn for c in cells if c.variant == "fedavg"] == [
        c.drawn for c in cells if c.variant == "fedprox"
    ]
    assert cells[2].name == "fedavg_r1_seed0"


def test_only_keeps_the_cells_that_match_one_filter():
    spec = parse_sweep({"seeds": [0, 1, 2], "grid": {"algorithm.local.lr": [0.01, 0.1]}})
    cells = expand_cells(spec, {"fedavg": 0, "fedprox": 0})
    picked = select(cells, parse_only(["variant=fedavg,seed=1", "algorithm.local.lr=0.01,seed=2"], spec))
    lr = "algorithm.local.lr"
    assert picked == [
        Cell("fedavg", 1, ((lr, 0.01),)),
        Cell("fedavg", 2, ((lr, 0.01),)),
        Cell("fedavg", 1, ((lr, 0.1),)),
        Cell("fedprox", 2, ((lr, 0.01),)),
    ]
    assert select(cells, []) == cells


def test_cell_tags_follow_the_contract():
    cell = Cell("fedavg", 1, (("algorithm.local.lr", 0.01),))
    assert cell.tags("quick-1a2b3c4d") == {
        "raysim.sweep": "quick-1a2b3c4d",
        "raysim.cell": "fedavg_lr0.01_seed1",
        "raysim.axis.variant": "fedavg",
        "raysim.axis.seed": "1",
        "raysim.axis.algorithm.local.lr": "0.01",
    }


def test_a_grid_mapping_names_its_values_in_cell_names_tags_and_filters():
    shards, dirichlet = {"kind": "shards"}, {"kind": "dirichlet", "alpha": 0.1}
    spec = parse_sweep({"seeds": [0], "grid": {"dataset.partition": {"A": shards, "B-dir0.1": dirichlet}}})
    cells = expand_cells(spec, {"fedavg": 0})
    assert [c.name for c in cells] == ["fedavg_partitionA_seed0", "fedavg_partitionB-dir0.1_seed0"]
    assert cells[1].label == "fedavg partition=B-dir0.1 seed=0"
    assert cells[1].overrides() == ["dataset.partition={alpha: 0.1, kind: dirichlet}", "seed=0"]
    assert cells[1].tags("s")["raysim.axis.dataset.partition"] == "B-dir0.1"
    assert select(cells, parse_only(["dataset.partition=B-dir0.1"], spec)) == [cells[1]]


@pytest.mark.parametrize("value", [1.0e-05, 0.1, 3, "sgd", [16, 16], True, None, {"kind": "iid"}])
def test_an_axis_value_goes_through_an_override_unchanged(value):
    assert yaml.safe_load(as_yaml(value)) == value


def test_the_sweep_id_is_stable_and_follows_axes_and_base_job():
    spec = parse_sweep({"seeds": [0, 1]})
    base = {"name": "quick", "engine": {"num_rounds": 5}}
    assert sweep_id("quick", spec, base) == sweep_id(
        "quick", parse_sweep({"seeds": [0, 1], "max_cells": 9}), base
    )
    assert sweep_id("quick", spec, base).startswith("quick-")
    assert sweep_id("quick", spec, base) != sweep_id("quick", parse_sweep({"seeds": [0, 2]}), base)
    assert sweep_id("quick", spec, base) != sweep_id("quick", spec, {**base, "engine": {"num_rounds": 6}})


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"grid": {"algorithm.local.lr": []}}, "sweep.grid.algorithm.local.lr: an empty axis"),
        ({"seeds": []}, "sweep.seeds:"),
        ({"gird": {}}, "sweep.gird: unknown key; did you mean 'grid'?"),
        ({"grid": {"seed": [0, 1]}}, "sweep.grid.seed: sweep seeds with sweep.seeds"),
        ({"seeds": [0, 0]}, "sweep.seeds: a seed is listed twice"),
        ({"random": {"samples": 2, "axes": {"a.b": {"uniform": [1, 0]}}}}, "needs low < high"),
        ({"random": {"samples": 2, "axes": {"a.b": {"log_uniform": [0, 1]}}}}, "log_uniform needs 0 < low"),
        ({"random": {"samples": 2, "axes": {"a.b": {}}}}, "give exactly one of"),
        ({"random": {"samples": 0, "axes": {"a.b": {"choice": [1]}}}}, "sweep.random.samples:"),
        ({"stopping": {"metric": "m", "mode": "up"}}, "sweep.stopping.mode:"),
        ([1, 2], "sweep: must be a mapping"),
    ],
)
def test_each_bad_sweep_section_is_one_error(raw, problem):
    with pytest.raises(ConfigError) as info:
        parse_sweep(raw)
    assert len(info.value.problems) == 1 and problem in info.value.problems[0], info.value.problems


def test_a_bad_only_filter_names_the_axes_and_the_nearest():
    spec = parse_sweep({"grid": {"algorithm.local.lr": [0.1]}})
    with pytest.raises(
        ConfigError, match=r"--only algorithm.local.rl: not an axis.*did you mean 'algorithm.local.lr'"
    ):
        parse_only(["algorithm.local.rl=0.1"], spec)
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_only(["fedavg"], spec)
    with pytest.raises(ConfigError, match=r"--only qqqqq: not an axis of this sweep \(axes: "):
        parse_only(["qqqqq=1"], spec)  # before: "not an axis of this sweep; (axes: ..."
