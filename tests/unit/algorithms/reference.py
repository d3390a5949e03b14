"""An independent numpy reference for a linear softmax classifier (tests only)."""

import sys
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


def payload(w=W0, b=B0, extra=None):
    """The broadcast of ``(w, b)``, with a plugin's ``extra`` dataclass (None: nothing more)."""
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


def server_steps(
    kind,
    grads,
    w0,
    *,
    lr,
    momentum=0.0,
    nesterov=False,
    beta1=0.9,
    beta2=0.99,
    tau=1e-3,
    v0=0.0,
    bias_correction=False,
):
    """(w, m, v) after one server step per pseudo-gradient (``global - local``) in ``grads``.

    Adam, Yogi and Adagrad as in Reddi et al. 2021, Algorithm 2, with the sign of our deltas:
    m_t = b1 m + (1 - b1) g; v_t per optimizer; w <- w - lr m_t / (sqrt(v_t) + tau); v starts at
    ``v0``, m at zero; ``bias_correction`` divides m_t and v_t by 1 - b^t (torch's Adam). SGD
    keeps m <- momentum m + g and steps on m (or on g + momentum m with Nesterov), as torch's SGD.
    """
    w = np.array(w0, dtype=np.float64)
    m, v = np.zeros_like(w), np.full_like(w, v0)
    for t, g in enumerate(np.asarray(grads, dtype=np.float64), start=1):
        if kind == "sgd":
            m = momentum * m + g
            w = w - lr * (g + momentum * m if nesterov else m)
            continue
        m = beta1 * m + (1 - beta1) * g
        if kind == "adagrad":
            v = v + g**2
        elif kind == "adam":
            v = beta2 * v + (1 - beta2) * g**2
        else:  # yogi
            v = v - (1 - beta2) * g**2 * np.sign(v - g**2)
        m_hat, v_hat = (m / (1 - beta1**t), v / (1 - beta2**t)) if bias_correction else (m, v)
        w = w - lr * m_hat / (np.sqrt(v_hat) + tau)
    return w, m, v


def plugin_types(plugin):
    """The module of a registered plugin, holding its state dataclasses (the registry loads plugin
    files under private module names, so tests reach them through the plugin)."""
    return sys.modules[type(plugin).__module__]
