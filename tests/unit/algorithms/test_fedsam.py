"""FedSAM and FedASAM (algorithms/fedsam.py) are FedAvg whose clients take
``raysim.train.sharpness.sam_step`` steps (tested against a numpy reference in
tests/unit/train/test_sharpness.py): their updates equal ``train_local`` with that step, and differ
from FedAvg's."""

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, linear_model, payload

from raysim import registry
from raysim.train.local import LocalHooks, LocalTrainConfig, train_local
from raysim.train.sharpness import sam_step
from raysim.types import ClientData

X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -1.2], [2.0, 0.1]])
Y = np.array([0, 1, 0, 1])
LOCAL = {"lr": 0.3, "batch_size": 2, "epochs": 2, "momentum": 0.5}


def update(name, **options):
    entry = registry.get("algorithm", name)
    algo = entry.factory(entry.config.model_validate({"local": LOCAL} | options))
    return algo.client_update(context(X, Y, payload())).update


@pytest.mark.parametrize(
    ("name", "step"),
    [("fedsam", sam_step(0.05)), ("fedasam", sam_step(0.7, adaptive=True, eta=0.2))],
)
def test_the_client_is_train_local_with_the_sam_step(name, step):
    model = linear_model()
    data = ClientData({"x": X.astype(np.float32), "y": Y})
    train_local(model, data, LocalTrainConfig(**LOCAL), seed=0, spec=SPEC, hooks=LocalHooks(step=step))
    got = update(name)
    assert torch.equal(got["weight"], torch.tensor(W0).float() - model.weight.detach())
    assert torch.equal(got["bias"], torch.tensor(B0).float() - model.bias.detach())
    assert not torch.allclose(got["weight"], update("fedavg")["weight"], atol=1e-5)


def test_defaults():
    sam = registry.get("algorithm", "fedsam").config()
    asam = registry.get("algorithm", "fedasam").config()
    assert (sam.sam.rho, sam.sam.adaptive) == (0.05, False)
    assert (asam.sam.rho, asam.sam.eta, asam.sam.adaptive) == (0.7, 0.2, True)


def test_rho_zero_is_fedavg():
    assert np.allclose(
        update("fedsam", sam={"rho": 0.0})["weight"].numpy(), update("fedavg")["weight"].numpy(), atol=1e-7
    )
