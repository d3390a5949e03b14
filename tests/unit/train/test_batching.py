"""A BatchNorm model trains on any client size: an epoch's last batch of one joins the batch before
it, a client with a single example trains with its BatchNorm layers on their running statistics;
a model without BatchNorm keeps its short last batch."""

import numpy as np
import pytest
import torch
from torch import nn

from raysim import params as P
from raysim.train.batching import batch_plan, epoch_batches, has_batchnorm, iterate_batches, lone_example
from raysim.train.local import LocalTrainConfig, train_local
from raysim.train.vectorized import train_local_vectorized
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("classification", (1, 6, 6), 3)


def bn_model() -> nn.Module:
    """BatchNorm after a 1x1 feature map: torch refuses a batch of one there in train mode."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 6), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4, 3))


def plain_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 3))


def data(n: int, seed: int = 0) -> ClientData:
    rng = np.random.default_rng(seed)
    return ClientData({"x": rng.normal(size=(n, 1, 6, 6)).astype(np.float32), "y": rng.integers(0, 3, n)})


def test_a_last_batch_of_one_joins_the_batch_before_only_when_asked():
    order = torch.arange(9)
    assert [len(b) for b in epoch_batches(order, 4, merge_lone=True)] == [4, 5]
    assert [len(b) for b in epoch_batches(order, 4, merge_lone=False)] == [4, 4, 1]
    assert torch.equal(torch.cat(epoch_batches(order, 4, merge_lone=True)), order)  # same order, all kept
    assert [len(b) for b in epoch_batches(torch.arange(1), 4, merge_lone=True)] == [1]  # nothing to join
    assert [len(b) for b in epoch_batches(torch.arange(10), 4, merge_lone=True)] == [4, 4, 2]
    assert epoch_batches(torch.arange(0), 4, merge_lone=True) == []


def test_only_batchnorm_in_train_mode_asks_for_it():
    model = bn_model()
    assert has_batchnorm(model) and not has_batchnorm(plain_model())
    assert not has_batchnorm(model.eval())


@pytest.mark.parametrize("batch_size", [10, 16, 32])
def test_a_batchnorm_model_trains_a_client_whose_last_batch_would_be_one_example(batch_size):
    n = 2 * batch_size + 1
    config = LocalTrainConfig(batch_size=batch_size, epochs=2)
    metrics = train_local(bn_model(), data(n), config, seed=1, spec=SPEC)
    assert metrics["train/steps"] == 4 and metrics["train/num_examples"] == n  # every example, 2 epochs


def test_a_model_without_batchnorm_keeps_its_last_batch_of_one():
    metrics = train_local(plain_model(), data(9), LocalTrainConfig(batch_size=4), seed=1, spec=SPEC)
    assert metrics["train/steps"] == 3
    assert [len(b["y"]) for b in iterate_batches({"y": torch.arange(9)}, 4)] == [4, 4, 1]


def test_a_single_example_trains_with_the_running_statistics_left_as_they_were():
    model = bn_model()
    bn = model[1]
    before = {k: v.clone() for k, v in bn.named_buffers()}
    weight = model[0].weight.detach().clone()
    metrics = train_local(model, data(1), LocalTrainConfig(batch_size=4, lr=0.5), seed=1, spec=SPEC)
    assert metrics["train/steps"] == 1 and metrics["train/num_examples"] == 1
    assert not torch.equal(model[0].weight, weight)  # it trained
    for key, value in bn.named_buffers():  # running mean, variance and count untouched
        assert torch.equal(value, before[key]), key
    assert bn.training  # and the layer is back in train mode


def test_lone_example_leaves_other_batches_alone():
    model = bn_model()
    with lone_example(model, 2):
        assert model[1].training
    with lone_example(model, 1):
        assert not model[1].training
    assert model[1].training


def test_the_vectorized_plan_is_train_locals():
    plan = batch_plan(9, 4, 2, None, seed=3, merge_lone=True)
    generator = torch.Generator().manual_seed(3)
    local = [
        b["i"]
        for _ in range(2)
        for b in iterate_batches({"i": torch.arange(9)}, 4, generator, merge_lone=True)
    ]
    assert [p.tolist() for p in plan] == [b.tolist() for b in local] and [len(p) for p in plan] == [4, 5] * 2


def test_vectorized_training_agrees_on_merged_and_lone_batches():
    sizes, seeds = (9, 1, 5, 6), (11, 12, 13, 14)
    datas, config = [data(n, seed=n) for n in sizes], LocalTrainConfig(lr=0.1, batch_size=4, epochs=2)
    stacked, metrics, _ = train_local_vectorized(bn_model(), datas, config, seeds=seeds, spec=SPEC)
    for i, d in enumerate(datas):
        alone = bn_model()
        expected = train_local(alone, d, config, seed=seeds[i], spec=SPEC)
        for key, value in P.model_params(alone).items():  # parameters and BatchNorm statistics
            torch.testing.assert_close(stacked[key][i], value, rtol=1e-5, atol=1e-6, msg=f"client {i} {key}")
        assert metrics[i] == pytest.approx(expected, rel=1e-5)
