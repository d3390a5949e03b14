"""An untracked sweep's ledger: a line torn by a driver killed while writing it is skipped with
one warning (it used to stop every rerun with a JSONDecodeError), and the next outcome noted
starts a line of its own, so no later record is lost by being glued onto the torn one."""

import json

from raysim.sweep.cell_ledger import CellLedger, CellOutcome


def test_a_torn_last_line_is_skipped_with_one_warning_and_the_next_note_starts_a_new_line(tmp_path):
    ledger = CellLedger(tmp_path / "sweeps" / "tiny-0123abcd.jsonl")
    ledger.note(CellOutcome("a_seed0", "FINISHED", seconds=3.0))
    ledger.note(CellOutcome("b_seed0", "FAILED", error="ValueError: no"))
    whole = json.dumps({"cell": "c_seed0", "status": "FINISHED", "run_id": None})
    with ledger.path.open("a") as file:
        file.write(whole[:20])  # a driver SIGKILLed in mid-write
    said = []
    assert ledger.finished_cells(said.append) == {"a_seed0"}
    assert said == [
        f"warning: {ledger.path}: skipped 1 torn line(s) (3), left by a driver killed while "
        "writing; the cells they noted run again"
    ]
    ledger.note(CellOutcome("c_seed0", "STOPPED"))  # the rerun runs c again
    said.clear()
    assert ledger.finished_cells(said.append) == {"a_seed0", "c_seed0"}
    assert len(said) == 1 and "(3)" in said[0]  # the torn line stays torn; the new one is whole


def test_a_ledger_without_torn_lines_says_nothing(tmp_path):
    ledger = CellLedger(tmp_path / "x.jsonl")
    said = []
    assert ledger.finished_cells(said.append) == set()  # no ledger yet
    ledger.note(CellOutcome("a_seed0", "FINISHED"))
    ledger.path.write_text(ledger.path.read_text() + "\n")  # a blank line is not a torn one
    assert ledger.finished_cells(said.append) == {"a_seed0"} and said == []
