"""A job of several variants stopped between two of them (a stop request, as SIGTERM notes it):
it ends with the finished variant's table and links and the command that runs the rest (it used
to print nothing), and that command skips the finished variant and ends with both in its table
(it used to run every variant again)."""

import pytest
import yaml
from mlflow.tracking import MlflowClient

from raysim.cli import variant_runs
from raysim.cli.main import main
from raysim.stop_request import clear_stop_request, note_stop_request

JOB = {
    "name": "stopped",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "engine": {"num_rounds": 2, "cohort_size": 3},
    "evaluation": {"every": 1},
    "resources": {"backend": "serial"},
    "tracking": {"experiment": "stops", "progress": False},
    "variants": [{"name": "first"}, {"name": "second", "algorithm": {"local": {"lr": 0.05}}}],
}


def test_a_stop_after_the_first_variant_prints_its_table_and_a_rerun_runs_the_rest(
    tmp_path, tracking_uri, capsys, monkeypatch
):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    command = ["run", str(path), "engine.cohort_size=4", "--output-dir", str(tmp_path / "out")]
    noted = variant_runs.note_finished

    def stop_after_first(result, output_dir):
        noted(result, output_dir)
        note_stop_request(143)  # SIGTERM's note: honoured at the second variant's first client

    monkeypatch.setattr(variant_runs, "note_finished", stop_after_first)
    with pytest.raises(SystemExit) as stopped:
        main(command)
    clear_stop_request()
    out = capsys.readouterr().out
    assert stopped.value.code == 143
    assert "first" in out and "raysim runs (final round)" in out and "run stopped/first" in out
    rest = f"raysim run {path} engine.cohort_size=4 --output-dir {tmp_path / 'out'}"
    assert (
        "stopped in variant second: 1 of 2 variants finished; the same command runs the other 1 "
        f"(the finished ones are skipped): {rest}"
    ) in " ".join(out.split())  # the console wraps nothing, but the check ignores line ends

    monkeypatch.setattr(variant_runs, "note_finished", noted)
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "1 finished before, 1 to run (first skipped; --rerun-finished runs them again)" in out
    assert "run stopped/first" in out and "run stopped/second" in out  # both in the links
    client = MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("stops").experiment_id])
    assert sorted((r.data.tags["variant"], r.info.status) for r in runs) == [
        ("first", "FINISHED"),  # run once
        ("second", "FINISHED"),
        ("second", "KILLED"),
    ]
