"""``at_weights``: the model's forward and features at other weights, gradients reaching them."""

import pytest
import torch
from torch import nn

from raysim.train.at_weights import at_weights


class Split(nn.Module):
    """features(x) = relu(W1 x), head W2, no biases: small enough for hand values."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 2, bias=False)
        self.head = nn.Linear(2, 1, bias=False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_at_weights_runs_forward_and_features_at_the_given_weights():
    """W1 = [[1, 0], [0, -1]], W2 = [[2, 3]], x = (1, 1): features relu(1, -1) = (1, 0), output 2."""
    model = Split()
    own = {k: v.clone() for k, v in model.state_dict().items()}
    weights = {
        "body.weight": torch.tensor([[1.0, 0.0], [0.0, -1.0]]),
        "head.weight": torch.tensor([[2.0, 3.0]]),
    }
    view = at_weights(model, weights)
    x = torch.ones(1, 2)
    assert torch.equal(view.features(x), torch.tensor([[1.0, 0.0]]))
    assert torch.equal(view(x), torch.tensor([[2.0]]))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in own.items())  # the model is untouched
    assert list(view.parameters()) == [] and list(view.buffers()) == []  # a view, not a copy


def test_at_weights_passes_gradients_to_what_the_weights_came_from():
    """W1 = a I, W2 = a (2, 3), x = (1, 0): features (a, 0), output 2a * a = 2a^2, d/da = 4a = 6."""
    model = Split()
    a = torch.tensor(1.5, requires_grad=True)
    weights = {"body.weight": a * torch.eye(2), "head.weight": a * torch.tensor([[2.0, 3.0]])}
    at_weights(model, weights)(torch.tensor([[1.0, 0.0]])).sum().backward()
    assert a.grad is not None and float(a.grad) == pytest.approx(4 * 1.5)
    assert model.body.weight.grad is None  # the model's own weights took no part
