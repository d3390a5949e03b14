"""The cost table of runs against sums, maxima and means by hand."""


from raysim.engine.cost_table import cost_fields, cost_markdown, cost_rows
from raysim.engine.tables import RunRecord

MiB = 2**20


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
