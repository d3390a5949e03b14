"""The job's ``system:`` section (raysim.config.system): validated, and absent by default."""

import pytest

from raysim.config import JobConfig
from raysim.errors import ConfigError


def test_the_system_section_is_validated_and_absent_by_default():
    base = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    job = JobConfig.from_dict(base)
    assert job.system is None and "system" not in job.to_dict()
    assert "time_to_target" not in job.to_dict()["evaluation"]
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(base | {"system": {"over_commit": 0.5, "dropout": 1, "deadline": 3}})
    problems = "\n".join(info.value.problems)
    assert "system.over_commit" in problems and "system.dropout" in problems
    assert "system.deadline: unknown key; did you mean 'deadline_s'" in problems
    with pytest.raises(ConfigError, match="evaluation.time_to_target.metric: must be an evaluation metric"):
        JobConfig.from_dict(
            base | {"evaluation": {"time_to_target": {"metric": "train/loss", "values": [1]}}}
        )
    on = JobConfig.from_dict(base | {"system": {"availability": {"kind": "diurnal"}, "deadline_s": 60}})
    assert JobConfig.from_dict(on.to_dict()) == on
