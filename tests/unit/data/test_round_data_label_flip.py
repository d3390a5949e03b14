"""A label-flipping attack on what a round trains on (raysim/data/round_data.py, augment.py): the
malicious clients' batches carry flipped labels, the others' are untouched, and the flipped central
test set measures the attack's success."""

from types import SimpleNamespace

import numpy as np
import torch

from raysim.config import JobConfig
from raysim.data.augment import training_transform
from raysim.data.round_data import flipped_test, label_flippers
from raysim.data.store import DatasetConfig
from raysim.robust.attacks import flip_label_table, job_malicious
from raysim.types import ClientData, DataSpec

SPEC = DataSpec(task="classification", input_shape=(4,), num_classes=4)


def job(attack):
    return JobConfig.from_dict(
        {
            "dataset": {"name": "digits"},
            "model": {"name": "mlp"},
            "algorithm": {"name": "fedavg"},
            "attack": attack,
        }
    )


def test_only_the_malicious_clients_train_on_flipped_labels():
    store = SimpleNamespace(spec=SPEC, num_clients=20, mean=None, std=None)
    flipping = job({"kind": "label_flip", "fraction": 0.25})
    flippers, table = label_flippers(flipping, store)
    assert flippers == job_malicious(flipping, 20, ("label_flip",)) and len(flippers) == 5
    batch = {"x": torch.zeros(4, 4), "y": torch.tensor([0, 1, 2, 3])}
    bad = training_transform(DatasetConfig(), store, 0, 0, min(flippers), table)
    assert bad(batch, 0)["y"].tolist() == [3, 2, 1, 0]
    assert training_transform(DatasetConfig(), store, 0, 0, 1) is None  # no flip: batches as stored
    assert label_flippers(job({"kind": "sign_flip", "fraction": 0.25}), store) == (frozenset(), None)


def test_the_flipped_test_set_keeps_the_examples_whose_label_changes_labelled_as_flipped():
    test = ClientData({"x": np.arange(5, dtype=np.float32)[:, None], "y": np.array([0, 1, 2, 3, 1])})
    store = SimpleNamespace(central_test=lambda: test)
    flipped = flipped_test(store, flip_label_table(4, {1: 2}))
    assert flipped.arrays["y"].tolist() == [2, 2] and flipped.arrays["x"][:, 0].tolist() == [1.0, 4.0]
