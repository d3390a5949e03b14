"""Piped output is never wrapped: a run's name stays whole on its line (it was folded at 120)."""

import io

from rich.console import Console

from raysim.cli.console import PIPE_WIDTH, READING_WIDTH, reading_width, width_for
from raysim.cli.runs import runs_table


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(name: str):
    from types import SimpleNamespace as NS

    info = NS(run_name=name, run_id="0" * 32, status="FINISHED", start_time=0, experiment_id="1")
    return NS(info=info, data=NS(params={"seed": "0"}, tags={"algorithm": "fedavg"}))


def test_a_pipe_gets_no_width_so_run_names_stay_whole():
    assert width_for(io.StringIO(), {}) == PIPE_WIDTH
    assert width_for(io.StringIO(), {"COLUMNS": "90"}) is None and width_for(_Tty(), {}) is None
    name = "quickstart/fedprox " + " ".join(f"algorithm.local.lr=0.{i}" for i in range(6))
    out = io.StringIO()
    Console(file=out, width=width_for(out, {})).print(runs_table([_run(name)], {"1": "quickstart"}))
    assert any(name in line for line in out.getvalue().splitlines())


def test_a_table_that_fills_the_console_keeps_a_reading_width_when_piped():
    assert reading_width(Console(file=io.StringIO(), width=PIPE_WIDTH)) == READING_WIDTH
    assert reading_width(Console(file=io.StringIO(), width=80)) == 80
