"""The cost table of runs against sums, maxima and means by hand."""

import csv
import math

import pytest

from raysim.results.cost_table import cost_fields, cost_markdown, cost_rows, cost_spread, write_cost_csv
from raysim.results.tables import RunRecord

MiB = 2**20
S, P, U = "sys/client_seconds", "sys/client_peak_bytes", "sys/params_up"


def record(name, history):
    return RunRecord(name=name, algorithm=name, final={}, history=history)


FIRST = {"sys/params_up": 10.0, "sys/bytes_up": 40.0, "sys/client_seconds": 1.0}
SECOND = {"sys/params_up": 30.0, "sys/bytes_up": 120.0, "sys/client_seconds": 3.0}
MODEL = {"sys/macs_per_example": 2e6}
EVALUATED = {"sys/inference_macs_per_example": 9e6, "sys/inference_params": 5e5}
STAGED = record(
    "fusefl",
    [
        (0, FIRST | MODEL | {"sys/client_peak_bytes": 3 * MiB}),
        (1, SECOND | MODEL | EVALUATED | {"sys/client_peak_bytes": MiB}),
    ],
)


def test_seconds_and_sent_values_add_up_and_the_peak_is_the_largest():
    assert cost_fields(STAGED) == {
        "sys/params_up": 40.0,
        "sys/bytes_up": 160.0,
        "sys/client_seconds": 4.0,
        "sys/client_peak_bytes": 3 * MiB,
        "sys/macs_per_example": 2e6,
        "sys/inference_macs_per_example": 9e6,
        "sys/inference_params": 5e5,
    }


def test_columns_no_run_has_are_left_out_and_units_are_scaled():
    headers, rows = cost_rows([STAGED, record("old", [(0, {"train/loss": 1.0})])])
    assert headers == ["run", "algorithm", "client s", "peak MiB", "train MMAC", "up M", "up MiB",
                       "infer MMAC", "infer M"]  # fmt: skip
    assert rows[0][2:] == ["4.00", "3.0", "2.000", "0.000", "0.00", "9.000", "0.500"]
    assert rows[1][2:] == ["-"] * 7  # a run from before cost accounting
    assert cost_markdown([STAGED]).splitlines()[1] == "|---|---|" + "---:|" * 7


def seed_mean(*members):
    """A mean over seeds as ``raysim compare --over-seeds`` builds it: its own history holds only
    the steps every seed logged, averaged."""
    return RunRecord("fusefl (2 seeds)", "fusefl", {}, [(0, {})], members=members)


def test_a_mean_over_seeds_is_each_seeds_own_cost_averaged_with_its_sample_std():
    """Seed a: 1 + 2 s, peaks 5 and 7 MiB, 0.5 + 0.5 M parameters up; seed b: 6 s, 3 MiB, 1 M.
    Means 4.5 s, 5 MiB (not 4: the mean of each seed's peak, not the peak of a mean step), 1 M;
    sample stds |3 - 6| / sqrt(2), |7 - 3| / sqrt(2), 0."""
    a = record("fusefl seed=0", [(0, {S: 1.0, P: 5 * MiB, U: 5e5}), (1, {S: 2.0, P: 7 * MiB, U: 5e5})])
    b = record("fusefl seed=1", [(0, {S: 6.0, P: 3 * MiB, U: 1e6})])
    mean = seed_mean(a, b)
    assert cost_fields(mean) == {S: 4.5, P: 5 * MiB, U: 1e6}
    assert cost_spread(mean) == pytest.approx({S: 3 / math.sqrt(2), P: 4 * MiB / math.sqrt(2), U: 0.0})
    headers, [row] = cost_rows([mean])
    assert headers[2:] == ["client s", "peak MiB", "up M"]
    assert row[2:] == ["4.50 ± 2.12", "5.0 ± 2.8", "1.000 ± 0.000"]
    assert cost_spread(a) == {} and cost_rows([a])[1][0][2] == "3.00"  # one run: no spread


def test_the_csv_holds_the_std_over_seeds_beside_each_mean(tmp_path):
    a = record("a", [(0, {"sys/bytes_up": 10.0})])
    b = record("b", [(0, {"sys/bytes_up": 30.0})])
    path = write_cost_csv([seed_mean(a, b), a], tmp_path / "cost.csv")
    mean_row, single_row = csv.DictReader(path.open())
    assert float(mean_row["sys/bytes_up"]) == 20.0
    assert float(mean_row["sys/bytes_up:std"]) == pytest.approx(math.sqrt(200.0))  # 10 each side of 20
    assert single_row["sys/bytes_up"] == "10.0" and single_row["sys/bytes_up:std"] == ""
