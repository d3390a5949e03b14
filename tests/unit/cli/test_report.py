"""``raysim report`` against a tracking server that is away: one error line, in seconds (MLflow's
own retries held it past 120 s)."""

import sys
import time
from pathlib import Path

import pytest

from raysim.cli.main import main
from raysim.results import run_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/mlflow_failures.py
from mlflow_failures import hung_uri, refused_uri  # noqa: E402

REPORT = ["report", "quickstart", "--metric", "eval/central/accuracy", "--no-log", "--tracking-uri"]
BOUND_S = 15  # the check's 5 s, or one call of 2 x 10 s at most; here a refusal or the 5 s check


def one_error_line(argv: list[str], capsys) -> str:
    """The command's one line on stderr, checked to come within ``BOUND_S`` with exit status 2."""
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < BOUND_S
    out = capsys.readouterr()
    [line] = out.err.strip().splitlines()
    assert "Traceback" not in out.out + out.err
    return line


@pytest.mark.timeout(120)  # unfixed, MLflow's retries ran minutes
def test_a_server_that_is_gone_or_hangs_is_one_line_naming_it(capsys, tmp_path):
    uri = refused_uri()
    line = one_error_line([*REPORT, uri, "--out", str(tmp_path)], capsys)
    assert f"{uri} refused the connection" in line and "--tracking-uri" in line
    with hung_uri() as uri:
        line = one_error_line([*REPORT, uri, "--out", str(tmp_path)], capsys)
    assert f"{uri} did not answer within 5 s" in line


@pytest.mark.timeout(120)
def test_a_server_that_goes_away_after_the_check_is_one_line_too(capsys, monkeypatch, tmp_path):
    # the server answered the check, and went away after it
    monkeypatch.setattr(run_store, "check_existing_tracking_store", lambda uri, hint: None)
    uri = refused_uri()
    line = one_error_line([*REPORT, uri, "--out", str(tmp_path)], capsys)
    assert f"the MLflow store {uri} cannot be read (no connection)" in line


@pytest.mark.parametrize("uri", ["ftp://x", "sqlite:/x.db"])
def test_a_uri_of_no_store_is_one_line(uri, capsys, tmp_path):
    """Tracebacks from MLflow and SQLAlchemy (issue 29, item 7)."""
    assert uri in one_error_line([*REPORT, uri, "--out", str(tmp_path)], capsys)


def test_a_file_that_is_no_sqlite_database_is_one_line_and_left_as_it_was(capsys, tmp_path):
    """SQLite took a 1-byte file for an empty database, which MLflow made a store (issue 29, item 7)."""
    (tmp_path / "x.db").write_bytes(b"x")
    line = one_error_line([*REPORT, f"sqlite:///{tmp_path / 'x.db'}", "--out", str(tmp_path)], capsys)
    assert f"{tmp_path / 'x.db'} is a file but not a SQLite database" in line
    assert (tmp_path / "x.db").read_bytes() == b"x" and [p.name for p in tmp_path.iterdir()] == ["x.db"]


def test_an_output_dir_that_is_a_file_is_refused_before_any_store_is_read(capsys, tmp_path):
    """FileExistsError's traceback, after the table was printed (issue 29, item 7)."""
    (tmp_path / "taken").write_text("")
    with pytest.raises(SystemExit) as exit_:
        main([*REPORT, "ftp://never-read", "--output-dir", str(tmp_path / "taken")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert (
        f"argument --output-dir/--out: the output folder {tmp_path / 'taken'} (--output-dir) is a file" in err
    )
