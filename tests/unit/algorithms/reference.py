"""An independent numpy reference for a linear softmax classifier (tests only)."""

from dataclasses import replace

import numpy as np
import torch
from torch import nn

from raysim import params as P
from raysim.types import ClientContext, ClientData, DataSpec, Payload

SPEC = DataSpec(task="classification", input_shape=(2,), num_classes=2)
W0 = np.array([[0.5, -0.25], [0.1, 0.3]])
B0 = np.array([0.05, -0.05])


def grad(w, b, x, y):
    """Gradient of the mean cross-entropy of softmax(x @ w.T + b): (p - onehot)^T x / n."""
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = p - np.eye(w.shape[0])[y]
    return err.T @ x / len(x), err.mean(0)


def linear_model():
    model = nn.Linear(2, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor(W0))
        model.bias.copy_(torch.tensor(B0))
    return model.float()


def payload(w=W0, b=B0, **extra):
    return Payload({"weight": w.astype(np.float32), "bias": b.astype(np.float32)}, extra)


def context(x, y, payload_, state=None, client_id=0):
    global_params = {k: torch.from_numpy(v) for k, v in payload_.params.items()}
    return ClientContext(
        client_id=client_id,
        round_num=0,
        model=linear_model(),
        payload=replace(payload_, extra=P.to_device(payload_.extra, "cpu")),  # as the worker does
        global_params=global_params,
        data=ClientData({"x": np.asarray(x, np.float32), "y": np.asarray(y, np.int64)}),
        state=state,
        seed=0,
        device=torch.device("cpu"),
        spec=SPEC,
    )
