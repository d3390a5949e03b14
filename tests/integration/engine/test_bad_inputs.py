"""Inputs that used to go wrong quietly: a job name that reaches outside --output-dir."""

import pytest

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.errors import ConfigError


def test_a_job_name_cannot_put_its_run_folder_outside_the_output_dir(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"name: names the run folder.*\(got '../../../escaped_job'\)"):
        run(tiny_job(name="../../../escaped_job"), output_dir=tmp_path / "a" / "b" / "out")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]  # nothing written anywhere
