"""``raysim runs`` against a tracking server that is away: one error line, in seconds (MLflow's
own retries took 256 s to a dead server and ended in a traceback)."""

import sys
import time
from pathlib import Path

import pytest

from raysim.cli.main import main
from raysim.results import run_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/mlflow_failures.py
from mlflow_failures import hung_uri, refused_uri  # noqa: E402

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


@pytest.mark.timeout(120)  # unfixed, MLflow's retries ran 256 s
def test_a_server_that_is_gone_or_hangs_is_one_line_naming_it(capsys):
    uri = refused_uri()
    line = one_error_line(["runs", "--tracking-uri", uri], capsys)
    assert f"{uri} refused the connection" in line and "--tracking-uri" in line
    with hung_uri() as uri:
        line = one_error_line(["runs", "--tracking-uri", uri], capsys)
    assert f"{uri} did not answer within 5 s" in line


@pytest.mark.timeout(120)
def test_a_server_that_goes_away_after_the_check_is_one_line_too(capsys, monkeypatch):
    # the server answered the check, and went away after it
    monkeypatch.setattr(run_store, "check_existing_tracking_store", lambda uri, hint: None)
    uri = refused_uri()
    line = one_error_line(["runs", "--tracking-uri", uri], capsys)
    assert f"the MLflow store {uri} cannot be read (no connection)" in line and "--tracking-uri" in line


def sqlite_without_mlflow(path: Path) -> Path:
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text)")
    return path


@pytest.mark.parametrize(
    "content, says",
    [
        (b"x", "is a file but not a SQLite database"),  # SQLite took it for an empty database
        (b"", "no MLflow store at"),
        (b"not a database, some notes\n", "is a file but not a SQLite database"),
        (None, "is a SQLite database but no MLflow store"),
    ],
)
def test_a_file_that_is_no_mlflow_store_is_refused_and_left_as_it_was(content, says, capsys, tmp_path):
    """``raysim runs`` made a 1-byte or empty file into a 954 KB MLflow store; other files ended in
    SQLAlchemy's traceback (issue 29, item 7). A read-only command never makes a store."""
    path = tmp_path / "mlflow.db"
    if content is None:
        sqlite_without_mlflow(path)
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    line = one_error_line(["runs", "--tracking-uri", f"sqlite:///{path}"], capsys)
    assert says in line and str(path) in line and "--tracking-uri" in line
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    "uri, says",
    [
        ("sqlite:/x.db", "sqlite:/x.db is no SQLite URI: write sqlite:///"),
        ("ftp://x", "MLflow has no store for the scheme 'ftp' (ftp://x)"),
        ("file:///tmp/mlruns", "file:///tmp/mlruns is MLflow's file store"),
    ],
)
def test_a_uri_of_no_store_raysim_reads_is_one_line(uri, says, capsys):
    """Each was a traceback from SQLAlchemy or MLflow (issue 29, item 7)."""
    assert says in one_error_line(["runs", "--tracking-uri", uri], capsys)
