"""What build checks before any work starts."""

import pytest


def test_a_job_that_needs_ray_or_mlflow_says_so_before_any_work(monkeypatch):
    import importlib.util

    from raysim.config import JobConfig
    from raysim.engine.build import check_installed
    from raysim.errors import ResourceError

    job = JobConfig.from_dict(
        {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    )
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name in ("ray", "mlflow") else real(name)
    )
    with pytest.raises(
        ResourceError, match="needs ray and mlflow.*resources.backend=serial tracking.enabled=false"
    ):
        check_installed(job)
    serial = JobConfig.from_dict(
        job.to_dict() | {"resources": {"backend": "serial"}, "tracking": {"enabled": False}}
    )
    check_installed(serial)  # nothing missing that this job needs


@pytest.mark.parametrize("num_rounds", [3, 2], ids=["at the end", "past it"])
def test_resuming_with_no_round_left_names_the_fix(num_rounds):
    from raysim.engine.resumed_state import check_rounds_left
    from raysim.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"c.pt already completed rounds 0..2.*raise engine.num_rounds above 3"
    ):
        check_rounds_left(2, num_rounds, "c.pt")
    check_rounds_left(2, 4, "c.pt")  # round 3 is left to run


def test_a_run_folder_stays_under_the_output_dir_even_for_an_unvalidated_name(tmp_path):
    from raysim.engine.build import new_run_dir
    from raysim.errors import ConfigError

    assert new_run_dir(tmp_path / "out", "tiny").parent == tmp_path / "out" / "runs"
    for name in ("../../../escaped_job", "a/b"):
        with pytest.raises(ConfigError, match="outside .*runs; use a plain name"):
            new_run_dir(tmp_path / "out", name)
