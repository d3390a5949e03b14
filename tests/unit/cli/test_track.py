"""``raysim track upload`` of a file naming a store or run that is not there: one line naming the
file and the fix, nothing sent and no store made (issue 29, item 7)."""

import json
from pathlib import Path

from raysim.cli.main import main
from raysim.tracking.outbox import UNSENT_FILE

END = {"seq": 0, "kind": "end", "status": "FINISHED"}


def unsent_for(folder: Path, run_id: str, uri: str) -> Path:
    path = folder / UNSENT_FILE
    path.write_text(json.dumps({"run_id": run_id, "tracking_uri": uri}) + "\n" + json.dumps(END) + "\n")
    return path


def one_error_line(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    out = capsys.readouterr()
    [line] = out.err.strip().splitlines()
    assert "Traceback" not in out.out + out.err
    return line


def test_a_run_its_store_does_not_hold_is_named_and_nothing_is_noted_sent(tmp_path, capsys):
    """MLflow's RESOURCE_DOES_NOT_EXIST traceback."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # a store without that run
    capsys.readouterr()  # MLflow's lines making it
    path = unsent_for(tmp_path, "f" * 32, uri)
    before = path.read_text()
    line = one_error_line(["track", "upload", str(tmp_path)], capsys)
    assert f"{path} names MLflow run {'f' * 32}, which {uri} does not hold; pass --tracking-uri" in line
    assert path.read_text() == before


def test_a_store_that_is_gone_is_named_and_not_made_anew(tmp_path, capsys):
    """MLflow made an empty store there, then failed on the run with a traceback."""
    path = unsent_for(tmp_path, "f" * 32, f"sqlite:///{tmp_path / 'moved.db'}")
    line = one_error_line(["track", "upload", str(tmp_path)], capsys)
    assert f"no MLflow store at {tmp_path / 'moved.db'}; pass --tracking-uri" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
