"""Client state survives across rounds and retried rounds read the state from before the round."""

import torch

from raysim.client_state import ClientStateStore


def test_get_returns_newest_state_before_the_round(tmp_path):
    store = ClientStateStore(tmp_path)
    assert store.get(7, before_round=0) is None
    store.put(7, 0, {"c": torch.tensor([1.0])})
    store.put(7, 3, {"c": torch.tensor([2.0])})
    assert store.get(7, before_round=3)["c"].item() == 1.0
    assert store.get(7, before_round=4)["c"].item() == 2.0


def test_retrying_a_round_sees_the_pre_round_state(tmp_path):
    store = ClientStateStore(tmp_path)
    store.put(1, 4, {"v": torch.tensor(4.0)})
    store.put(1, 5, {"v": torch.tensor(5.0)})  # first attempt of round 5 wrote
    assert store.get(1, before_round=5)["v"].item() == 4.0  # the retry still sees round 4
    store.put(1, 6, {"v": torch.tensor(6.0)})  # overwrites round 4's slot
    assert store.get(1, before_round=7)["v"].item() == 6.0
    assert store.num_clients() == 1


def test_state_a_weights_only_load_cannot_read_is_refused_at_once(tmp_path):
    import numpy as np
    import pytest

    store = ClientStateStore(tmp_path)
    with pytest.raises(TypeError, match=r"client 3's state\['c'\]\[1\] is a numpy.ndarray"):
        store.put(3, 0, {"c": [torch.zeros(1), np.zeros(2)]})
    store.put(3, 0, {"c": [torch.zeros(1), 2.0, "x", (1, 2), {4}]})  # all plain: fine
    assert store.get(3, before_round=1)["c"][2] == "x"
