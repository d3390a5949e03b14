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
