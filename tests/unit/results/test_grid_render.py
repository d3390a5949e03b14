"""The three formats of a 2x2 table, against golden strings written by hand.

fedavg at alpha 0.1: 0.5, 0.7 -> 0.6 ± sqrt(0.02) = 0.1414; at 1.0: 0.8, 0.9 -> 0.85 ± 0.0707.
fedprox at 0.1: 0.6, 0.8 -> 0.7 ± 0.1414 (best); at 1.0: 0.82 and a failed seed -> 0.82 (1†),
below fedavg's 0.85 (best)."""

import pytest

from raysim.errors import RaysimError
from raysim.results.grid_paired import paired
from raysim.results.grid_render import csv_text, latex, markdown, paired_markdown, seed_band_curves
from raysim.results.grid_table import Selection, Statistic, build_table
from raysim.results.seed_run import SeedRun

TEST = "eval/central/accuracy"
RULE = (
    "metric: eval/central/accuracy, final value of each run; cells: mean ± sample std (ddof=1) over "
    "seeds, n = finished seeds; best per column marked (higher is better); † = the cell has failed "
    "seeds (left out of its mean)"
)


def run(variant, alpha, seed, value, lr="0.1"):
    axes = {"variant": variant, "seed": str(seed), "dataset.alpha": alpha, "lr": lr}
    curves = {} if value is None else {TEST: ((0, 0.1), (1, value)), "eval/heldout/accuracy": ((1, value),)}
    return SeedRun(f"{variant}{alpha}{seed}{lr}", f"{variant}-{alpha}-{seed}", axes, value is None, curves)


RUNS = [
    run("fedavg", "0.1", 0, 0.5), run("fedavg", "0.1", 1, 0.7),
    run("fedavg", "1.0", 0, 0.8), run("fedavg", "1.0", 1, 0.9),
    run("fedprox", "0.1", 0, 0.6), run("fedprox", "0.1", 1, 0.8),
    run("fedprox", "1.0", 0, 0.82), run("fedprox", "1.0", 1, None),
]  # fmt: skip


def table():
    return build_table(RUNS, TEST, Statistic("final"), columns="dataset.alpha")


def test_markdown():
    assert markdown(table()) == (
        f"{RULE}\n\n"
        "| variant | alpha=0.1 | alpha=1.0 |\n"
        "|---|---|---|\n"
        "| fedavg | 0.6000 ± 0.1414 (2) | **0.8500 ± 0.0707 (2)** |\n"
        "| fedprox | **0.7000 ± 0.1414 (2)** | 0.8200 (1†) |\n"
    )


def test_latex():
    assert latex(table()) == (
        f"% {RULE}\n"
        "\\begin{tabular}{lcc}\n"
        "\\toprule\n"
        "variant & alpha=0.1 & alpha=1.0 \\\\\n"
        "\\midrule\n"
        "fedavg & $0.6000 \\pm 0.1414$ (2) & \\textbf{$0.8500 \\pm 0.0707$ (2)} \\\\\n"
        "fedprox & \\textbf{$0.7000 \\pm 0.1414$ (2)} & $0.8200$ (1$^\\dagger$) \\\\\n"
        "\\bottomrule\n"
        "\\end{tabular}\n"
    )


def test_csv():
    assert csv_text(table()) == (
        "row,column,mean,std,num_seeds,num_failed,best,chosen,seeds,values\n"
        "fedavg,0.1,0.6,0.141421,2,0,0,,0;1,0.5;0.7\n"
        "fedavg,1.0,0.85,0.0707107,2,0,1,,0;1,0.8;0.9\n"
        "fedprox,0.1,0.7,0.141421,2,0,1,,0;1,0.6;0.8\n"
        "fedprox,1.0,0.82,,1,1,0,,0,0.82\n"
    )


def test_selection_is_recorded_with_the_table():
    runs = [*RUNS, *(run(r.axes["variant"], r.axes["dataset.alpha"], r.axes["seed"], 0.3, lr="0.01")
                     for r in RUNS)]  # fmt: skip
    text = markdown(build_table(runs, TEST, Statistic("final"), columns="dataset.alpha",
                                selection=Selection("lr", "eval/heldout/accuracy")))  # fmt: skip
    assert text.endswith(
        "lr chosen:\n\n| variant | alpha=0.1 | alpha=1.0 |\n|---|---|---|\n"
        "| fedavg | 0.1 | 0.1 |\n| fedprox | 0.1 | 0.1 |\n"
    )


def test_paired_comparison():
    """fedavg - fedprox per seed: alpha 0.1: -0.1, -0.1 (fedprox better twice); alpha 1.0: seed 0
    only (seed 1 of fedprox failed): 0.8 - 0.82 = -0.02."""
    pairs = paired(table(), "fedavg", "fedprox")
    assert [(p.column, p.seeds, p.wins, p.ties, p.losses) for p in pairs] == [
        ("0.1", ("0", "1"), 0, 0, 2),
        ("1.0", ("0",), 0, 0, 1),
    ]
    assert [round(p.mean_difference, 9) for p in pairs] == [-0.1, -0.02]
    with pytest.raises(RaysimError, match="no such variant; the rows are fedavg, fedprox"):
        paired(table(), "fedavg", "fedyogi")
    assert paired_markdown(pairs).endswith(
        "| column | seeds | fedavg better | ties | fedprox better | mean fedavg − fedprox |\n"
        "|---|---|---|---|---|---|\n"
        "| 0.1 | 2 | 0 | 0 | 2 | -0.1000 ± 0.0000 |\n| 1.0 | 1 | 0 | 0 | 1 | -0.0200 |\n"
    )


def test_curves_png(tmp_path):
    path = seed_band_curves(table(), tmp_path / "curves.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
