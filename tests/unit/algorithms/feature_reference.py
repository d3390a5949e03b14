"""A two-layer linear model with ``features`` and ``head``, and client contexts for it (tests only).

features(x) = x V^T (D = 3), logits = features W^T + b (3 classes): small enough to follow by
hand, with a body below the head so that detaching the features matters.
"""

import numpy as np
import torch
from torch import nn

from raysim import params as P
from raysim.types import ClientContext, ClientData, DataSpec, Payload

SPEC3 = DataSpec(task="classification", input_shape=(2,), num_classes=3)
V0 = np.array([[1.0, 0.5], [-0.3, 0.8], [0.2, -0.4]])
W0 = np.array([[0.5, -0.25, 0.1], [0.1, 0.3, -0.2], [-0.4, 0.2, 0.3]])
B0 = np.array([0.05, -0.05, 0.0])


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 3, bias=False)
        self.head = nn.Linear(3, 3)
        with torch.no_grad():
            self.body.weight.copy_(torch.tensor(V0))
            self.head.weight.copy_(torch.tensor(W0))
            self.head.bias.copy_(torch.tensor(B0))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def feature_context(x, y, extra=None, *, state=None, round_num=0, client_id=0) -> ClientContext:
    """A client of ``TwoLayer`` at (V0, W0, B0), as the worker builds it."""
    model = TwoLayer()
    global_params = P.clone(P.model_params(model))
    payload = Payload(P.to_numpy(global_params), extra)
    return ClientContext(
        client_id=client_id,
        round_num=round_num,
        model=model,
        payload=Payload(payload.params, P.to_device(payload.extra, "cpu")),  # arrays arrive as tensors
        global_params=global_params,
        data=ClientData({"x": np.asarray(x, np.float32), "y": np.asarray(y, np.int64)}),
        state=state,
        seed=0,
        device=torch.device("cpu"),
        spec=SPEC3,
    )


def reference_params():
    """(V, W, b) at the start, float64 leaves that require gradients."""
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (V0, W0, B0)]
