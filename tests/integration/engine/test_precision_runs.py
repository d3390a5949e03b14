"""``resources.precision: bf16`` reaches the workers' local updates, sequential and vectorized:
a run trains to a finite model near fp32's and not equal to it. ``resources.deterministic``
changes no bit of a CPU run."""

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


@pytest.fixture
def restore_determinism():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_deterministic_kernels_leave_a_cpu_run_s_model_as_it_was(tmp_path, restore_determinism):
    """On a CPU torch's kernels are deterministic already: the switch must change no bit (and
    raise for no op the run uses); on CUDA it is what makes runs repeat."""

    def final(deterministic):
        job = tiny_job(resources={"deterministic": deterministic}, engine={"num_rounds": 2})
        return run(job, output_dir=tmp_path / str(deterministic)).state.params

    plain, deterministic = final(False), final(True)
    assert torch.are_deterministic_algorithms_enabled()  # the serial worker is this process
    assert all(torch.equal(deterministic[k], plain[k]) for k in plain)
