"""Hashed dropout: uniform draws, and each client's masks a pure function of its seed, whichever
chunk (and position in it) trains the client."""

import numpy as np
import torch
from torch import nn

from raysim.models.dropout import Dropout
from raysim.train.hashed_dropout import HashedDropout, hashed_uniform, hashed_words
from raysim.train.local import LocalTrainConfig
from raysim.train.vectorizable import vectorization_blocker
from raysim.train.vectorized import train_local_vectorized
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("classification", (8,), 3)
CONFIG = LocalTrainConfig(lr=0.1, batch_size=4, epochs=2)


def dropout_model(p=0.5, layer=nn.Dropout):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), layer(p), nn.Linear(32, 3))


def data(n, seed):
    rng = np.random.default_rng(seed)
    return ClientData({"x": rng.normal(size=(n, 8)).astype(np.float32), "y": rng.integers(0, 3, n)})


def test_draws_are_uniform_and_differ_by_key_and_counter():
    draws = hashed_uniform(torch.tensor(12345), 7, torch.Size([200_000]), torch.device("cpu"))
    assert 0.0 <= float(draws.min()) and float(draws.max()) < 1.0
    assert abs(float(draws.mean()) - 0.5) < 0.005
    assert abs(float((draws < 0.25).float().mean()) - 0.25) < 0.005
    hist = torch.histc(draws, bins=10, min=0.0, max=1.0) / len(draws)
    assert float((hist - 0.1).abs().max()) < 0.005
    other_key = hashed_uniform(torch.tensor(12346), 7, torch.Size([1000]), torch.device("cpu"))
    other_counter = hashed_uniform(torch.tensor(12345), 8, torch.Size([1000]), torch.device("cpu"))
    assert abs(float(torch.corrcoef(torch.stack([draws[:1000], other_key]))[0, 1])) < 0.1
    assert not torch.equal(draws[:1000], other_counter)


def test_the_four_draws_of_one_hash_are_uncorrelated_and_on_the_16_bit_grid():
    words = hashed_words(torch.tensor(777), 3, torch.Size([400_000]), torch.device("cpu"))
    assert int(words.min()) >= 0 and int(words.max()) < 2**16
    quarters = words.view(-1, 4).double()  # the four 16-bit parts of each 64-bit hash
    for a in range(4):
        for b in range(a + 1, 4):
            assert abs(float(torch.corrcoef(torch.stack([quarters[:, a], quarters[:, b]]))[0, 1])) < 0.01
    draws = hashed_uniform(torch.tensor(777), 3, torch.Size([400_000]), torch.device("cpu"))
    assert torch.equal(draws * 2**16, words.float())


def test_hashed_dropout_keeps_one_minus_p_and_scales_the_kept():
    model = nn.Sequential(nn.Dropout(0.1))
    dropout = HashedDropout(model)
    for _ in dropout.over(iter([(0,)])):
        dropout.begin_forward(torch.tensor(7))
        out = model(torch.ones(400_000))
    kept = out != 0
    assert abs(float(kept.float().mean()) - 0.9) < 0.003
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.9))


def test_a_clients_training_is_the_same_in_any_chunk_at_any_position():
    target = data(10, 1)
    alone, _, _ = train_local_vectorized(dropout_model(), [target], CONFIG, seeds=[99], spec=SPEC)
    crowd = [data(6, 2), data(13, 3), target]  # other sizes: the target trains in other groups too
    together, _, _ = train_local_vectorized(dropout_model(), crowd, CONFIG, seeds=[5, 6, 99], spec=SPEC)
    for key, value in alone.items():
        assert torch.equal(together[key][2], value[0]), key


def test_clients_of_the_same_data_draw_their_own_masks():
    same, full_batch = [data(10, 1), data(10, 1)], LocalTrainConfig(lr=0.1, batch_size=10, epochs=2)
    trained, _, _ = train_local_vectorized(dropout_model(), same, full_batch, seeds=[1, 2], spec=SPEC)
    gap = (trained["0.weight"][0] - trained["0.weight"][1]).abs().max()
    without, _, _ = train_local_vectorized(dropout_model(0.0), same, full_batch, seeds=[1, 2], spec=SPEC)
    torch.testing.assert_close(without["0.weight"][0], without["0.weight"][1])  # no dropout: one work
    assert gap > 1e-3  # other seeds, other masks


def test_the_models_own_dropout_is_back_after_training():
    model = dropout_model()
    train_local_vectorized(model, [data(4, 1)], CONFIG, seeds=[1], spec=SPEC)
    assert "forward" not in vars(model[2])  # the class's forward, torch's masks
    torch.manual_seed(0)
    out = model[2](torch.ones(10_000))
    assert abs(float((out == 0).float().mean()) - 0.5) < 0.03


def test_the_built_in_models_dropout_is_hashed_alike():
    """raysim's ``Dropout`` (its own CPU mask outside vmap) trains vectorized to the same weights
    as ``nn.Dropout``: the same hashed masks replace both."""
    clients, seeds = [data(10, 1), data(7, 2)], [3, 4]
    torchs, _, _ = train_local_vectorized(dropout_model(), clients, CONFIG, seeds=seeds, spec=SPEC)
    ours, _, _ = train_local_vectorized(dropout_model(layer=Dropout), clients, CONFIG, seeds=seeds, spec=SPEC)
    assert all(torch.equal(ours[key], value) for key, value in torchs.items())


class LockedDropout(nn.Dropout):
    """One mask for every row of a batch: another law than nn.Dropout's, so not to be hashed."""

    def forward(self, x):
        if not self.training:
            return x
        return x * (torch.rand_like(x[:1]) >= self.p) / (1 - self.p)


def test_a_subclass_with_a_forward_of_its_own_is_not_hashed_and_is_refused():
    model = dropout_model(layer=LockedDropout)
    assert HashedDropout(model).layers == []
    assert "random numbers" in vectorization_blocker(model, torch.zeros(2, 8))
    assert vectorization_blocker(dropout_model(layer=Dropout), torch.zeros(2, 8)) is None
