"""``resources.precision`` and ``resources.deterministic``: bf16 autocast trains a tiny model to a
finite result near, and not equal to, fp32's; fp32 is the plain update; the determinism switch
turns torch's deterministic kernels on; bad values are refused naming the key."""

import numpy as np
import pytest
import torch
from torch import nn

from raysim import params as P
from raysim.config import JobConfig, ResourcesConfig
from raysim.errors import ConfigError
from raysim.runtime.precision import local_precision, use_deterministic_kernels
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("classification", (8,), 3)
CPU = torch.device("cpu")


def trained(precision: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(0)
    data = ClientData({"x": rng.normal(size=(40, 8)).astype(np.float32), "y": rng.integers(0, 3, 40)})
    with local_precision(ResourcesConfig(precision=precision), CPU):  # type: ignore[arg-type]
        train_local(model, data, LocalTrainConfig(lr=0.1, batch_size=8, epochs=2), seed=1, spec=SPEC)
    return P.model_params(model)


def test_bf16_autocast_trains_near_fp32_in_float32_weights():
    full, half = trained("fp32"), trained("bf16")
    for key in full:
        assert half[key].dtype == torch.float32 and torch.isfinite(half[key]).all()
        torch.testing.assert_close(half[key], full[key], rtol=0, atol=0.05)  # bf16 keeps 8 bits
    assert any(not torch.equal(half[k], full[k]) for k in full)  # the products did run in bf16


def test_fp32_is_the_plain_update():
    assert not torch.is_autocast_enabled("cpu")
    with local_precision(ResourcesConfig(), CPU):
        assert not torch.is_autocast_enabled("cpu")
    with local_precision(ResourcesConfig(precision="bf16"), CPU):
        assert torch.is_autocast_enabled("cpu")


@pytest.fixture
def restore_determinism():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_the_determinism_switch_turns_deterministic_kernels_on(restore_determinism):
    use_deterministic_kernels(ResourcesConfig(), CPU)
    assert not torch.are_deterministic_algorithms_enabled()
    use_deterministic_kernels(ResourcesConfig(deterministic=True), CPU)
    assert torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("key, value", [("precision", "fp16"), ("deterministic", "sometimes")])
def test_bad_values_are_refused_naming_the_key(key, value):
    base = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    with pytest.raises(ConfigError, match=f"resources.{key}"):
        JobConfig.from_dict(base | {"resources": {key: value}})
