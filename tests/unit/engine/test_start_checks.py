"""The dry run's start checks: the run's own, on a prepared store; skipped, with the reason, without one."""

import pytest

from raysim.config import JobConfig
from raysim.data.prepare import prepare_store
from raysim.engine.start_checks import check_start
from raysim.errors import ConfigError

DIGITS = {"name": "digits", "partition": {"kind": "iid", "num_clients": 6}}


def job(**sections):
    model, engine = {"name": "mlp", "hidden": [8]}, {"cohort_size": 2}
    return JobConfig.from_dict({"dataset": DIGITS, "model": model, "engine": engine, **sections})


@pytest.fixture(scope="module", autouse=True)
def prepared():
    prepare_store("digits", job(algorithm={"name": "fedavg"}).dataset.config)


@pytest.mark.parametrize(
    ("algorithm", "refusal"),
    [("fedbn", "keeps BatchNorm layers local, and the model has none"), ("dense", "no BatchNorm2d layer")],
)
def test_a_model_the_algorithm_cannot_use_is_refused_as_the_run_refuses_it(algorithm, refusal):
    """Before, --dry-run passed these jobs, which failed at the run's start."""
    with pytest.raises(ConfigError, match=refusal):
        check_start(job(algorithm={"name": algorithm}))


def test_a_fitting_job_passes_and_an_unprepared_one_is_skipped_with_the_reason(tmp_path):
    assert check_start(job(algorithm={"name": "fedavg"})).num_clients == 6
    # its own empty cache: the shared one may hold any store another test or run prepared
    fresh = job(algorithm={"name": "fedavg"}, dataset={**DIGITS, "cache_dir": str(tmp_path)})
    assert check_start(fresh) == (
        "skipped: dataset digits is not prepared (raysim prepare JOB.yaml, then dry-run again)"
    )
