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
    monkeypatch.setattr(run_store, "check_tracking_store", lambda uri, hint: None, raising=False)
    uri = refused_uri()
    line = one_error_line(["runs", "--tracking-uri", uri], capsys)
    assert f"the MLflow store {uri} cannot be read (no connection)" in line and "--tracking-uri" in line
