"""``engine.vectorize``: a vectorized run trains the same model as the sequential loop (within float
tolerance; clients of unequal batch counts, chunks of unequal size, client state across rounds),
and ``on`` refuses before training what cannot vectorize, naming the part; a chunk that runs out
of memory is trained again in halves, to the model the smaller chunks give."""

import math

import pytest
import torch
from torch import nn

from jobs import tiny_job
from raysim import registry
from raysim.engine.loop import run
from raysim.errors import ConfigError
from raysim.models.weights import ModelConfig
from raysim.train import vectorized as vectorized_module


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


class UnusedHead(nn.Module):
    """A second head the forward never uses (vmap's gradient would give it zeros to decay)."""

    def __init__(self, features, classes):
        super().__init__()
        self.head, self.spare = nn.Linear(features, classes), nn.Linear(features, classes)

    def forward(self, x):
        return self.head(x.flatten(1))


def cumulative_norm(features, classes):  # BatchNorm's cumulative average: vmap cannot batch it
    norm = nn.BatchNorm1d(8, momentum=None)
    return nn.Sequential(nn.Flatten(), nn.Linear(features, 8), norm, nn.Linear(8, classes))


class IgnoresHidden(ModelConfig, frozen=True, extra="forbid"):
    hidden: list[int] = []  # tiny_job's model section sets it; these models ignore it


@pytest.mark.parametrize(
    "make, reason",
    [(cumulative_norm, "does not run under vmap"), (UnusedHead, "never uses the trainable parameters spare")],
)
def test_a_model_vmap_cannot_train_runs_sequentially_under_auto_and_is_refused_on(
    tmp_path, monkeypatch, make, reason
):
    name = f"{make.__name__.lower()}_test"
    registry.load_builtins()  # registered for this test only: the registry's listing tests see the zoo

    def build(config, spec):
        return make(math.prod(spec.input_shape), spec.num_classes)

    entry = registry.Entry("model", name, build, IgnoresHidden, "")
    monkeypatch.setitem(registry._entries["model"], name, entry)
    local = {"batch_size": 16, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}

    def final(mode):
        engine = {"vectorize": mode, "num_rounds": 1}
        job = tiny_job(model={"name": name}, engine=engine, algorithm={"name": "fedavg", "local": local})
        return run(job, output_dir=tmp_path / mode).state.params

    before, auto = final("off"), final("auto")
    assert all(torch.equal(auto[k], before[k]) for k in before)
    with pytest.raises(ConfigError, match=reason):
        final("on")


def test_a_chunk_out_of_memory_backs_off_to_the_smaller_chunks_model(tmp_path, monkeypatch, caplog):
    def final(chunk, name):
        engine = {"vectorize": "on", "vectorize_chunk": chunk}  # 6 clients a round, one worker
        return run(tiny_job(engine=engine), output_dir=tmp_path / name).state.params

    direct = final(2, "direct")
    stack = vectorized_module._stack

    def stack_within_two_clients(model, clients, config):  # the step's memory holds two clients
        if clients > 2:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {clients} clients")
        return stack(model, clients, config)

    monkeypatch.setattr(vectorized_module, "_stack", stack_within_two_clients)
    backed_off = final(4, "backed_off")
    assert all(torch.equal(backed_off[k], direct[k]) for k in direct)
    notes = [r.getMessage() for r in caplog.records if "ran out of memory" in r.getMessage()]
    assert len(notes) == 1 and "a chunk of 4 clients" in notes[0] and "chunks of 2" in notes[0]


def test_auto_chunks_train_the_sequential_runs_model(tmp_path):
    def final(engine):
        return run(tiny_job(engine=engine), output_dir=tmp_path / engine["vectorize"]).state.params

    sequential = final({"vectorize": "off"})
    auto = final({"vectorize": "on", "vectorize_chunk": "auto"})  # chunks of 2, 2, then measured
    torch.testing.assert_close(auto, sequential, rtol=1e-4, atol=1e-5)
