"""The evaluation metrics a job logs, read from its config: each scope present exactly when the
setting that turns it on is."""

from raysim.config import validate_job
from raysim.config.evaluated import check_evaluated, evaluated_keys

JOB = {
    "name": "quick",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def job(dataset=None, **evaluation):
    return validate_job({**JOB, "dataset": {**JOB["dataset"], **(dataset or {})}, "evaluation": evaluation})


def scopes(keys):
    return {key.removeprefix("eval/").rsplit("/", 1)[0] for key in keys}


def test_a_plain_job_logs_central_clients_and_personal_scopes_only():
    keys = evaluated_keys(job())
    assert scopes(keys) == {"central", "clients", "personal"}
    assert {"eval/clients/accuracy", "eval/clients/accuracy_p10", "eval/clients/loss_mean"} <= set(keys)
    assert "eval/central/accuracy_p10" not in keys  # the central test set has no spread over clients
    assert "eval/clients/perplexity_p10" not in keys  # only accuracy and loss have spreads


def test_each_setting_adds_its_scope():
    keys = evaluated_keys(
        job(
            {"validation_fraction": 0.1},
            heldout_fraction=0.2,
            personalization={"fractions": [0.25]},
            transfer=[{"name": "other", "dataset": {"name": "digits"}}],
        )
    )
    assert scopes(keys) == {"central", "clients", "personal", "validation", "heldout", "transfer/other",
                            "heldout/personalized_25"}  # fmt: skip


def test_check_names_the_nearest_key_and_passes_a_logged_one():
    assert check_evaluated("k", "eval/heldout/accuracy", job(heldout_fraction=0.2)) is None
    problem = check_evaluated("k", "eval/clients/acuracy", job())
    assert problem == (
        "k: 'eval/clients/acuracy' is not an evaluation metric this job logs; "
        "did you mean 'eval/clients/accuracy'?"
    )
    assert "e.g. eval/central/accuracy" in str(check_evaluated("k", "train/loss", job()))
