"""What a round tells a selector (raysim.selection.selector.feedback_of) and its weighted draw."""

import numpy as np
import pytest

from raysim.errors import ConfigError
from raysim.selection.selector import Feedback, feedback_of, weighted_draw
from raysim.types import TrainedClient


def test_feedback_takes_each_clients_loss_examples_and_seconds():
    clients = [
        TrainedClient(3, 7.0, 0.1, {"train/loss": 0.5, "train/num_examples": 40.0}),
        TrainedClient(5, 9.0, 0.1, {"train/loss": 1.5}),  # no count: its weight
    ]
    assert feedback_of(clients, {3: 12.0, 5: 30.0}) == [
        Feedback(3, 40.0, 0.5, 12.0),
        Feedback(5, 9.0, 1.5, 30.0),
    ]
    assert feedback_of(clients, None)[0].seconds is None


def test_a_client_without_a_training_loss_is_refused():
    with pytest.raises(ConfigError, match="train/loss"):
        feedback_of([TrainedClient(1, 1.0, 0.1, {"accuracy": 1.0})], None)


def test_the_weighted_draw_is_distinct_and_follows_the_weights():
    rng = np.random.default_rng(0)
    ids = np.arange(10, 20)
    drawn = weighted_draw(rng, ids, 10, np.zeros(10))  # zero weights still draw every one
    assert sorted(drawn) == list(ids)
    heavy = np.array([1e9, 1e9] + [1.0] * 8)
    assert set(weighted_draw(rng, ids, 2, heavy)) == {10, 11}
