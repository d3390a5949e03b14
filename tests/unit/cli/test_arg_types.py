"""Command-line values argparse refuses in one line (raysim/cli/arg_types.py): issue 29, item 8."""

import argparse

import pytest

from raysim.cli.arg_types import finite_float, positive_int
from raysim.cli.main import main


def test_a_limit_below_one_and_a_target_that_is_not_finite_are_refused():
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    for bad in ("nan", "inf", "-inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            finite_float(bad)
    assert positive_int("3") == 3 and finite_float("0.9") == 0.9


@pytest.mark.parametrize(
    "argv, says",
    [
        (["runs", "--limit", "-1"], "argument --limit: must be at least 1, got -1"),
        (["runs", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
        (["report", "x", "--metric", "m", "--target", "nan"], "argument --target: must be a finite number"),
        (["report", "x", "--metric", "m", "--target", "inf"], "argument --target: must be a finite number"),
    ],
)
def test_the_commands_refuse_them_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err
