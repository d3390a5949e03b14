"""What ``raysim.run`` checks before anything is built."""

import pytest

from raysim.config import JobConfig
from raysim.engine import loop
from raysim.errors import ResourceError


def test_an_output_dir_whose_runs_folder_cannot_be_made_is_refused_before_the_data(tmp_path, monkeypatch):
    """The run folder's mkdir failed with a traceback after the data was prepared (issue 29, item 7)."""
    (tmp_path / "runs").write_text("")  # where the run folders go
    monkeypatch.setattr(loop, "build", lambda *args: pytest.fail("built the run before the check"))
    job = JobConfig.from_dict(
        {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    )
    with pytest.raises(ResourceError, match=f"holds a file {tmp_path / 'runs'} where raysim makes a folder"):
        loop.run(job, output_dir=tmp_path)
