"""``resources.precision: bf16`` reaches the workers' local updates, sequential and vectorized:
a run trains to a finite model near fp32's and not equal to it; fp32 is the default."""

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_a_bf16_run_trains_near_the_fp32_runs_model(tmp_path, vectorize):
    def final(precision):
        job = tiny_job(resources={"precision": precision}, engine={"vectorize": vectorize, "num_rounds": 2})
        return run(job, output_dir=tmp_path / precision).state.params

    full, half = final("fp32"), final("bf16")
    for key in full:
        assert torch.isfinite(half[key]).all()
        torch.testing.assert_close(half[key], full[key], rtol=0, atol=0.05)
    assert any(not torch.equal(half[k], full[k]) for k in full)
