"""``engine.vectorize``: a vectorized run trains the same model as the sequential loop (within float
tolerance; clients of unequal batch counts, chunks of unequal size, client state across rounds),
and ``on`` refuses before training what cannot vectorize, naming the part."""

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.errors import ConfigError


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "scaffold", "local": {"batch_size": 16, "lr": 0.1}},
        {"name": "fedprox", "mu": 0.1, "local": {"batch_size": 16, "lr": 0.05, "momentum": 0.9}},
    ],
)
def test_a_vectorized_run_trains_the_sequential_runs_model(tmp_path, algorithm):
    def final(mode):
        engine = {"vectorize": mode, "vectorize_chunk": 4}  # 6 clients, one worker: chunks of 4 and 2
        job = tiny_job(algorithm=algorithm, engine=engine)
        return run(job, output_dir=tmp_path / mode)

    sequential, vectorized = final("off"), final("on")
    torch.testing.assert_close(vectorized.state.params, sequential.state.params, rtol=1e-4, atol=1e-5)
    assert vectorized.final["train/loss"] == pytest.approx(sequential.final["train/loss"], rel=1e-4)


@pytest.mark.parametrize(
    "sections, part",
    [
        ({"algorithm": {"name": "fedlc"}}, "the algorithm 'fedlc' has no vectorized_update"),
        ({"evaluation": {"probes": [{"name": "local_accuracy"}]}}, "evaluation.probes"),
    ],
)
def test_on_refuses_what_cannot_vectorize_before_training(tmp_path, sections, part):
    job = tiny_job(engine={"vectorize": "on"}, **sections)
    with pytest.raises(ConfigError, match=part) as caught:
        run(job, output_dir=tmp_path)
    assert "set engine.vectorize to auto or off" in str(caught.value)


def test_auto_runs_what_cannot_vectorize_as_before_bit_for_bit(tmp_path):
    def final(mode):
        job = tiny_job(algorithm={"name": "fedlc"}, engine={"vectorize": mode, "num_rounds": 2})
        return run(job, output_dir=tmp_path / mode).state.params

    before, auto = final("off"), final("auto")
    assert all(torch.equal(auto[k], before[k]) for k in before)
