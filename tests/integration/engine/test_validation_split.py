"""``dataset.validation_fraction`` in a run: the training clients' validation rows are evaluated
as ``eval/validation/...`` next to their test splits, and the clients train on the rest."""

from jobs import tiny_job
from raysim.engine.loop import run


def test_a_run_logs_its_validation_split(tmp_path):
    result = run(
        tiny_job(dataset={"validation_fraction": 0.25}, engine={"num_rounds": 2}), output_dir=tmp_path
    )
    final = result.final
    assert final["eval/validation/num_clients"] == final["eval/clients/num_clients"] == 20
    assert 0 <= final["eval/validation/accuracy"] <= 1
    assert final["eval/validation/accuracy"] != final["eval/clients/accuracy"]  # other rows
    plain = run(tiny_job(engine={"num_rounds": 2}), output_dir=tmp_path / "plain").final
    assert not any(key.startswith("eval/validation/") for key in plain)
    assert plain["train/loss"] != final["train/loss"]  # fewer rows trained on
