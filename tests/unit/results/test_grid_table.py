"""Grid tables against hand computations: the statistics of one run, mean and sample std over
seeds, the best per column, failed seeds, best-of-grid selection on validation, and bad input."""

import math

import pytest

from raysim.errors import RaysimError
from raysim.results.grid_table import Selection, Statistic, build_table, higher_is_better, keep_runs
from raysim.results.seed_run import SeedRun

TEST, VALID = "eval/central/accuracy", "eval/heldout/accuracy"


def seed_run(variant, seed, test, valid=None, failed=False, **axes):
    """A run whose curves end at ``test`` (and ``valid``), both logged at rounds 0 and 1."""
    curves = {TEST: ((0, 0.0), (1, test))}
    if valid is not None:
        curves[VALID] = ((0, 0.0), (1, valid))
    axes = {"variant": variant, "seed": str(seed), **{k: str(v) for k, v in axes.items()}}
    name = "/".join(f"{k}={v}" for k, v in axes.items())
    return SeedRun(run_id=name, name=name, axes=axes, failed=failed, curves={} if failed else curves)


CURVE = ((-1, 0.1), (0, 0.5), (1, 0.7), (2, 0.6))


def test_statistics_of_one_curve():
    """final: the last value 0.6; best: the max 0.7 (or, for a loss, the min over rounds >= 0:
    0.5, not the initial 0.1); last:2 = (0.7 + 0.6) / 2 = 0.65."""
    assert Statistic.parse("final").of(CURVE, higher=True) == 0.6
    assert Statistic.parse("best").of(CURVE, higher=True) == 0.7
    assert Statistic.parse("best").of(CURVE, higher=False) == 0.5
    assert Statistic.parse("last:2").of(CURVE, higher=True) == pytest.approx(0.65)
    assert Statistic.parse("last:9").of(CURVE, higher=True) == pytest.approx((0.5 + 0.7 + 0.6) / 3)
    for bad in ("last:0", "mean", "last:x"):
        with pytest.raises(RaysimError, match="final, best or last:K"):
            Statistic.parse(bad)


def test_direction_of_metrics():
    assert higher_is_better("eval/central/accuracy") and higher_is_better("eval/clients/mcc")
    assert not higher_is_better("train/loss") and not higher_is_better("eval/clients/perplexity_p90")
    assert not higher_is_better("group_barrier/loss_barrier") and not higher_is_better("barrier/error")
    assert not higher_is_better("group_barrier/accuracy_barrier")  # a barrier is a drop: lower is better


def test_mean_sample_std_best_and_failed_seeds():
    """fedavg: 0.80, 0.84, 0.88 -> mean 0.84, sample std sqrt((0.04² + 0 + 0.04²) / 2) = 0.04;
    fedprox: 0.90 and a failed seed -> mean 0.90, n = 1, one failed; fedprox is best."""
    runs = [seed_run("fedavg", s, v) for s, v in enumerate([0.80, 0.84, 0.88])]
    runs += [seed_run("fedprox", 0, 0.90), seed_run("fedprox", 1, None, failed=True)]
    table = build_table(runs, TEST, Statistic("final"))
    fedavg, fedprox = table.cells["fedavg", "all"], table.cells["fedprox", "all"]
    assert fedavg.mean == pytest.approx(0.84) and fedavg.std == pytest.approx(0.04)
    assert fedavg.seeds == ("0", "1", "2") and fedavg.num_failed == 0
    assert fedprox.values == (0.90,) and fedprox.num_failed == 1 and math.isnan(fedprox.std)
    assert table.best_row("all") == "fedprox"


def test_best_of_a_loss_is_the_lowest():
    runs = [SeedRun(f"{v}", v, {"variant": v, "seed": "0"}, curves={"train/loss": ((0, x),)})
            for v, x in [("a", 0.3), ("b", 0.2)]]  # fmt: skip
    assert build_table(runs, "train/loss", Statistic("final")).best_row("all") == "b"


def test_selection_chooses_on_validation_and_reports_test():
    """lr 0.01: validation 0.6, 0.7 (mean 0.65), test 0.9, 0.9; lr 0.1: validation 0.8, 0.7 (mean
    0.75), test 0.5, 0.6. Validation picks 0.1, so the cell is 0.1's test mean 0.55, although
    0.01's test is higher: choosing on test would have reported 0.9."""
    runs = [
        seed_run("fedavg", 0, 0.9, 0.6, lr=0.01),
        seed_run("fedavg", 1, 0.9, 0.7, lr=0.01),
        seed_run("fedavg", 0, 0.5, 0.8, lr=0.1),
        seed_run("fedavg", 1, 0.6, 0.7, lr=0.1),
    ]
    table = build_table(runs, TEST, Statistic("final"), selection=Selection("lr", VALID))
    cell = table.cells["fedavg", "all"]
    assert cell.chosen == "0.1" and cell.mean == pytest.approx(0.55)
    assert cell.scores == pytest.approx({"0.01": 0.65, "0.1": 0.75})
    assert (
        "lr chosen per variant and column by the highest mean over seeds of eval/heldout/accuracy"
        in "\n".join(table.rule())
    )


def test_a_diverged_value_is_never_chosen():
    """lr 0.01 (sorted first) logged a nan validation loss on one seed: lr 0.1 is chosen, although
    a nan mean compares as neither lower nor higher than 2.0."""
    runs = [
        SeedRun(f"{lr}{s}", f"{lr}{s}", {"variant": "a", "seed": str(s), "lr": lr},
                curves={TEST: ((0, 0.5),), "eval/heldout/loss": ((0, v),)})
        for lr, s, v in [("0.1", 0, 2.0), ("0.1", 1, 2.0), ("0.01", 0, math.nan), ("0.01", 1, 0.1)]
    ]  # fmt: skip
    table = build_table(runs, TEST, Statistic("final"), selection=Selection("lr", "eval/heldout/loss"))
    assert table.cells["a", "all"].chosen == "0.1"


def test_selection_per_row_and_column():
    """Each (variant, alpha) picks its own lr on validation."""
    runs = [
        seed_run(v, 0, test=t, valid=val, lr=lr, alpha=a)
        for v, a, lr, t, val in [
            ("fedavg", 0.1, 0.01, 0.1, 0.9), ("fedavg", 0.1, 0.1, 0.2, 0.1),
            ("fedavg", 1.0, 0.01, 0.3, 0.1), ("fedavg", 1.0, 0.1, 0.4, 0.9),
        ]
    ]  # fmt: skip
    table = build_table(runs, TEST, Statistic("final"), columns="alpha", selection=Selection("lr", VALID))
    assert [table.cells["fedavg", a].chosen for a in ("0.1", "1.0")] == ["0.01", "0.1"]
    assert [table.cells["fedavg", a].mean for a in ("0.1", "1.0")] == [0.1, 0.4]


def test_two_axes_are_selected_jointly():
    """The candidates are the (lr, server_lr) pairs, validation (seed 0, seed 1) -> mean:
    (0.1, 1): 0.5, 0.5 -> 0.5; (0.1, 0.1): 0.7, 0.7 -> 0.7; (0.01, 1): 0.75, 0.85 -> 0.8;
    (0.01, 0.1): 0.6, 0.6 -> 0.6. (0.01, 1) wins and its test mean (0.3 + 0.5) / 2 = 0.4 is
    reported, although every other pair tests at 0.9."""
    pairs = {(0.1, 1): (0.5, 0.5, 0.9, 0.9), (0.1, 0.1): (0.7, 0.7, 0.9, 0.9),
             (0.01, 1): (0.75, 0.85, 0.3, 0.5), (0.01, 0.1): (0.6, 0.6, 0.9, 0.9)}  # fmt: skip
    runs = [
        seed_run("fedavg", seed, tests[seed], valids[seed], lr=lr, server_lr=server)
        for (lr, server), (*valids, _, _) in pairs.items()
        for seed, tests in [(0, pairs[lr, server][2:]), (1, pairs[lr, server][2:])]
    ]
    table = build_table(runs, TEST, Statistic("final"), selection=Selection("lr,server_lr", VALID))
    cell = table.cells["fedavg", "all"]
    assert cell.chosen == "0.01, 1" and cell.mean == pytest.approx(0.4)
    assert cell.scores == pytest.approx({"0.1, 1": 0.5, "0.1, 0.1": 0.7, "0.01, 1": 0.8, "0.01, 0.1": 0.6})


def test_selection_on_a_test_metric_is_refused_unless_forced():
    runs = [seed_run("fedavg", 0, 0.9, 0.6, lr=0.01), seed_run("fedavg", 0, 0.5, 0.8, lr=0.1)]
    with pytest.raises(
        RaysimError, match="--on eval/central/accuracy: a test metric.*--force-test-selection"
    ):
        build_table(runs, TEST, Statistic("final"), selection=Selection("lr", TEST))
    with pytest.raises(RaysimError, match="a test metric"):  # the reported metric's own scope
        build_table(runs, VALID, Statistic("final"), selection=Selection("lr", "eval/heldout/loss"))
    forced = build_table(runs, TEST, Statistic("final"), selection=Selection("lr", TEST, force_test=True))
    assert forced.cells["fedavg", "all"].chosen == "0.01"
    assert "forced: a TEST metric" in forced.rule()[1]


def test_bad_inputs_are_one_clear_error_each():
    with pytest.raises(RaysimError, match="no runs to report"):
        build_table([], TEST, Statistic("final"))
    runs = [
        seed_run("fedavg", 0, 0.9),
        SeedRun("x1", "run-a", {"variant": "b", "seed": "0"}, curves={"train/loss": ((0, 1.0),)}),
        SeedRun("x2", "run-b", {"variant": "c", "seed": "0"}, curves={}),
    ]
    with pytest.raises(
        RaysimError, match=r"eval/central/accuracy is not logged by 2 of 3 runs: run-a, run-b"
    ):
        build_table(runs, TEST, Statistic("final"))
    grid = [seed_run("fedavg", 0, 0.9, lr=0.01), seed_run("fedavg", 0, 0.8, lr=0.1)]
    with pytest.raises(RaysimError, match=r"the runs differ in lr \(0.01, 0.1\): place each with --rows"):
        build_table(grid, TEST, Statistic("final"))
    twice = [seed_run("fedavg", 0, 0.9), seed_run("fedavg", 0, 0.8)]
    with pytest.raises(RaysimError, match="share variant, seed and every axis: report them apart"):
        build_table(twice, TEST, Statistic("final"))
    params = {"variant": "a", "seed": "0"}
    loose = [
        SeedRun(lr, lr, {}, curves={TEST: ((0, 0.5),)}, params={**params, "lr": lr, "tracking.run_dir": lr})
        for lr in ("0.1", "0.2")
    ]
    with pytest.raises(
        RaysimError, match=r"share variant, seed and every axis but differ in lr \(0.1, 0.2\): place"
    ):
        build_table(loose, TEST, Statistic("final"))
    with pytest.raises(RaysimError, match="no 'alpha' axis or param in runs"):
        build_table([seed_run("fedavg", 0, 0.9)], TEST, Statistic("final"), columns="alpha")


def test_loose_runs_are_grouped_by_params():
    """Runs without declared axes: the row and column come from their params."""
    runs = [SeedRun(f"r{s}{a}", f"r{s}{a}", {}, curves={TEST: ((0, 0.5 + s / 10),)},
                    params={"variant": "fedavg", "seed": str(s), "dataset.alpha": a})
            for s in (0, 1) for a in ("0.1", "1.0")]  # fmt: skip
    table = build_table(runs, TEST, Statistic("final"), columns="dataset.alpha")
    assert table.columns == ["0.1", "1.0"] and table.cells["fedavg", "1.0"].mean == pytest.approx(0.55)


def test_where_keeps_the_runs_meeting_every_condition():
    """A Local row that logs no central accuracy is dropped with variant!=local before the table
    checks that every run logged the metric; numbers match as numbers (0.50 = 0.5)."""
    runs = [seed_run("local", 0, 0.3, alpha=0.5), seed_run("fedavg", 0, 0.8, alpha=0.5),
            seed_run("fedavg", 0, 0.9, alpha=100)]  # fmt: skip
    runs[0] = SeedRun(runs[0].run_id, runs[0].name, runs[0].axes)  # logged nothing
    with pytest.raises(RaysimError, match="is not logged by 1 of 3 runs"):
        build_table(runs, TEST, Statistic.parse("final"), columns="alpha")
    kept = keep_runs(runs, ["variant!=local"])
    assert kept == runs[1:]
    table = build_table(kept, TEST, Statistic.parse("final"), columns="alpha")
    assert table.cells["fedavg", "100"].mean == 0.9
    assert keep_runs(runs, ["variant!=local", "alpha=0.50"]) == [runs[1]]
    with pytest.raises(RaysimError, match="no run has variant=moon"):
        keep_runs(runs, ["variant=moon"])
    with pytest.raises(RaysimError, match="expected KEY=VALUE or KEY!=VALUE"):
        keep_runs(runs, ["variant"])
