"""``dataset.poison``: FuseFL's shapes by hand, the trigger stamped where its draws say, only the
chosen clients' batches touched, and the attack success rate against a model whose predictions
the test decides."""

from types import SimpleNamespace

import numpy as np
import torch

from raysim.config.sections import AugmentConfig, PoisonConfig
from raysim.data.augment import training_transform
from raysim.data.poison import PALETTE, poison_batch, shape_masks, stamp, triggered_test
from raysim.data.store import DatasetConfig
from raysim.measure.evaluate import evaluate
from raysim.types import ClientData, DataSpec

CIRCLE_5 = [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]]
DIAMOND_5 = [[0, 0, 1, 0, 0], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0], [0, 0, 1, 0, 0]]
CROSS_5 = [[0, 0, 1, 0, 0], [0, 0, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0]]
identity = lambda colours: colours  # noqa: E731  images on the [0, 1] scale


def test_the_label_indexed_shapes_at_five_pixels():
    masks = shape_masks(5).int().tolist()
    assert masks[0] == CIRCLE_5 and masks[5] == DIAMOND_5 and masks[7] == CROSS_5
    assert masks[2] == [[1] * 5] * 5  # the square fills its patch
    assert len({str(m) for m in masks}) == 10  # ten different shapes


def test_stamp_draws_the_labels_shape_in_its_colour_at_its_position():
    seed = 3
    replay = torch.Generator().manual_seed(seed)
    top, left = (int(torch.randint(0, 3, (1,), generator=replay)) for _ in range(2))
    colour = int(torch.randint(0, 10, (1,), generator=replay))
    grey = float(PALETTE[colour] @ [0.299, 0.587, 0.114]) / 255
    x = torch.full((1, 1, 7, 7), 0.5)

    out = stamp(x, torch.tensor([15]), 5, torch.Generator().manual_seed(seed), identity)  # 15 % 10: diamond

    expected = np.full((7, 7), 0.5, np.float32)
    patch = expected[top : top + 5, left : left + 5]
    patch[np.array(DIAMOND_5, bool)] = grey
    np.testing.assert_allclose(out[0, 0].numpy(), expected, rtol=0, atol=1e-7)


def test_a_fraction_of_the_batch_gets_the_trigger_and_the_target_label():
    x, y = torch.zeros(8, 3, 6, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    config = PoisonConfig(clients=[0], fraction=0.5, target=2, trigger_size=3)
    out = poison_batch({"x": x, "y": y}, config, torch.Generator().manual_seed(0), identity)
    changed = (out["x"] != 0).flatten(1).any(1) | (out["y"] != y)
    assert int(changed.sum()) <= 4 and (out["y"][changed] == 2).all()
    assert torch.equal(out["y"][~changed], y[~changed])
    # without a target each image keeps its label and wears its own label's shape
    kept = poison_batch({"x": x, "y": y}, config.model_copy(update={"target": None}),
                        torch.Generator().manual_seed(0), identity)  # fmt: skip
    assert torch.equal(kept["y"], y)


def test_only_the_chosen_clients_batches_are_poisoned():
    augment_only = DatasetConfig(augment=AugmentConfig(crop_padding=1))
    config = augment_only.model_copy(update={"poison": PoisonConfig(clients=[1], trigger_size=2)})
    store = SimpleNamespace(mean=(0.5,), std=(0.25,))
    batch = {"x": torch.randn(6, 1, 4, 4), "y": torch.arange(6) % 3}

    def drawn(options, client):
        return training_transform(options, store, 7, 2, client)(batch, 0)

    assert torch.equal(drawn(config, 0)["x"], drawn(augment_only, 0)["x"])
    assert not torch.equal(drawn(config, 1)["x"], drawn(augment_only, 1)["x"])


class SeesTheBackground(torch.nn.Module):
    """Predicts class 1 for images whose mean is above 5 (a bright background a small trigger
    cannot darken enough), class 0 otherwise: the test decides every prediction."""

    def forward(self, x):
        bright = (x.flatten(1).mean(1) > 5).float()
        return torch.stack([1 - bright, bright], 1)


def test_attack_success_rate_is_the_share_of_non_target_images_predicted_as_the_target():
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    bright = np.array([1, 0, 1, 1, 1, 0, 0, 1], bool)  # background 10 or 0
    x = np.where(bright[:, None, None, None], 10.0, 0.0) * np.ones((8, 1, 4, 4))
    data = ClientData({"x": x.astype(np.float32), "y": labels})
    config = PoisonConfig(clients=[0], target=1, trigger_size=1)
    spec = DataSpec(task="classification", input_shape=(1, 4, 4), num_classes=3)

    triggered = triggered_test(data, config, 0, identity, 3)
    rate = evaluate(SeesTheBackground(), triggered, spec)["accuracy"]

    not_target = labels != 1
    assert rate == np.mean(bright[not_target])  # 4 of 6: the images already labelled 1 do not count
    assert len(triggered) == 6 and (triggered.arrays["y"] == 1).all()
