"""Channels-last convolutions in a client's training (``raysim.train.conv_layout``).

Only the memory layout may change: the trained weights must equal a plain contiguous SGD loop's
(written out here, independent of ``train_local``) to float32 rounding, the parameters must keep
their identity, and the model must come out contiguous, so that nothing after training sees the
layout. The convolutions must actually run on channels-last weights inside, after one-channel
images too (an (N, 1, H, W) tensor is both layouts at once: the input cannot decide).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raysim.config.privacy import SamplePrivacy
from raysim.train import conv_layout
from raysim.train.conv_layout import channels_last, wants_channels_last
from raysim.train.dp_sgd import SampleNoise
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

CHANNELS_LAST = torch.channels_last


def conv_net(channels: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(channels, 4, 3),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 3),
    )


def images(channels: int, n: int = 12) -> ClientData:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, channels, 8, 8)).astype(np.float32)
    return ClientData({"x": x, "y": (np.arange(n) % 3).astype(np.int64)})


def spec(channels: int) -> DataSpec:
    return DataSpec("classification", (channels, 8, 8), 3)


def plain_sgd(model: nn.Module, data: ClientData, config: LocalTrainConfig, seed: int) -> None:
    """The reference: contiguous tensors, train_local's documented shuffling (one randperm per epoch
    from a generator seeded with ``seed``), plain SGD on the mean cross-entropy."""
    x, y = torch.from_numpy(data.arrays["x"]), torch.from_numpy(data.arrays["y"])
    generator = torch.Generator().manual_seed(seed)
    for _ in range(config.epochs):
        for idx in torch.randperm(len(x), generator=generator).split(config.batch_size):
            model.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= config.lr * p.grad


def weight_layouts(model: nn.Module) -> list[bool]:
    """Records, at each forward of each convolution over more than one channel, whether its weight
    is channels-last (over one channel, a weight is both layouts at once)."""
    seen: list[bool] = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and module.in_channels > 1:
            module.register_forward_hook(
                lambda m, args, out: seen.append(
                    m.weight.is_contiguous(memory_format=CHANNELS_LAST) and not m.weight.is_contiguous()
                )
            )
    return seen


def test_auto_is_on_for_a_convolutional_model_on_the_cpu_only():
    assert wants_channels_last("auto", conv_net(3), "cpu")
    assert not wants_channels_last("auto", nn.Linear(3, 2), "cpu")  # nothing to lay out
    assert not wants_channels_last("auto", conv_net(3), torch.device("cuda", 0))  # not measured there
    assert wants_channels_last("on", nn.Linear(3, 2), "cuda")
    assert not wants_channels_last("off", conv_net(3), "cpu")


def shortcut_net(channels: int, stride: int = 2) -> nn.Module:
    """A small ResNet's shortcut: a 1x1 convolution over ``channels``, strided."""
    return nn.Sequential(nn.Conv2d(1, channels, 3), nn.Conv2d(channels, 8, 1, stride=stride))


def test_a_strided_1x1_convolution_over_few_channels_stays_contiguous_even_under_on(caplog, monkeypatch):
    monkeypatch.setattr(conv_layout, "_warned", set())  # warned once a process: not by another test
    assert not wants_channels_last("auto", shortcut_net(4), "cpu")  # the layer oneDNN mishandles
    assert not wants_channels_last("on", shortcut_net(4), "cpu")
    assert "convolution '1' (1x1, strided" in caplog.text and "trains contiguous" in caplog.text
    assert not wants_channels_last("off", shortcut_net(4), "cpu")
    assert wants_channels_last("on", shortcut_net(4), "cuda")  # torch's CPU kernels only
    assert wants_channels_last("auto", shortcut_net(8), "cpu")  # enough channels
    assert wants_channels_last("auto", shortcut_net(4, stride=1), "cpu")  # not strided


MALLOC_DEBUG = Path("/lib/x86_64-linux-gnu/libc_malloc_debug.so.0")
RESNET_CLIENT = """
import numpy as np, torch
from raysim.models.resnet import ResNet10Config, build_resnet10
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

assert "libc_malloc_debug" in open("/proc/self/maps").read()  # a preload that failed only warns
torch.set_num_threads(1)  # the kernel that wrote past its buffer ran on one thread
spec = DataSpec("classification", (1, 8, 8), 10)
rng = np.random.default_rng(0)
data = ClientData({"x": rng.normal(size=(48, 1, 8, 8)).astype(np.float32), "y": np.arange(48) % 10})
model = build_resnet10(ResNet10Config(width=4), spec)
train_local(model, data, LocalTrainConfig(batch_size=16), seed=0, spec=spec)
print("trained")
"""


@pytest.mark.skipif(not MALLOC_DEBUG.exists(), reason="glibc's malloc checks (glibc on x86-64)")
def test_a_small_resnet_trains_under_glibc_s_malloc_checks():
    """A ResNet-10 of width 4 on 1x8x8 images, ``channels_last: auto``: channels-last, its 4-channel
    shortcut's backward aborted the process on an AVX2 core (the checks catch the stray write at
    once; other machines' kernels did not write it, and pass either way)."""
    env = os.environ | {"LD_PRELOAD": str(MALLOC_DEBUG), "GLIBC_TUNABLES": "glibc.malloc.check=3"}
    run = subprocess.run(
        [sys.executable, "-c", RESNET_CLIENT], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip() == "trained", run.stderr[-2000:]


def test_the_setting_reads_yaml_booleans_and_refuses_anything_else():
    assert LocalTrainConfig().channels_last == "auto"
    assert LocalTrainConfig(channels_last=True).channels_last == "on"  # YAML's bare on
    assert LocalTrainConfig(channels_last=False).channels_last == "off"
    with pytest.raises(ValidationError, match="'auto', 'on' or 'off'"):
        LocalTrainConfig(channels_last="nhwc")


def test_the_block_lays_out_the_weights_and_restores_them_with_the_same_parameters_and_values():
    model = conv_net(3)
    params = list(model.parameters())
    values = [p.detach().clone() for p in params]
    with pytest.raises(RuntimeError, match="inside"):  # an error inside still restores the layout
        with channels_last(model):
            weight = model[0].weight
            assert weight.is_contiguous(memory_format=CHANNELS_LAST) and not weight.is_contiguous()
            assert model[5].weight.is_contiguous()  # a 2-D weight has no channels to move
            raise RuntimeError("inside")
    assert all(p.is_contiguous() for p in model.parameters())
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert all(torch.equal(p, v) for p, v in zip(model.parameters(), values))


@pytest.mark.parametrize("channels", [1, 3])
def test_training_channels_last_equals_a_plain_contiguous_loop_and_ends_contiguous(channels):
    config = LocalTrainConfig(epochs=2, batch_size=5, lr=0.1, channels_last="on")
    model, reference = conv_net(channels), conv_net(channels)
    layouts = weight_layouts(model)
    train_local(model, images(channels), config, seed=3, spec=spec(channels))
    plain_sgd(reference, images(channels), config, seed=3)
    assert layouts and all(layouts)  # every forward ran on channels-last weights
    assert all(p.is_contiguous() for p in model.parameters())
    initial = conv_net(channels)
    for trained, expected, start in zip(model.parameters(), reference.parameters(), initial.parameters()):
        assert not torch.allclose(trained, start)  # it trained
        torch.testing.assert_close(trained, expected, rtol=1e-5, atol=1e-6)


def test_off_and_dp_sgd_train_as_built():
    for config, privacy in [
        (LocalTrainConfig(batch_size=5, channels_last="off"), None),
        (LocalTrainConfig(batch_size=5), SampleNoise(SamplePrivacy(clip_bound=1.0, noise_multiplier=1.0), 7)),
    ]:
        model = conv_net(3)
        layouts = weight_layouts(model)
        train_local(model, images(3), config, seed=0, spec=spec(3), sample_privacy=privacy)
        assert layouts and not any(layouts)


def test_gradients_come_out_contiguous_too():
    model = conv_net(3)
    train_local(model, images(3), LocalTrainConfig(batch_size=5, channels_last="on"), seed=0, spec=spec(3))
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.is_contiguous() for g in grads)


def test_momentum_and_batchnorm_train_as_a_contiguous_run_does():
    """Momentum buffers and BatchNorm's running statistics live through the steps in the layout the
    block gave; the trained model must still equal the contiguous run's to float32 rounding."""

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3),
            nn.Flatten(),
            nn.Linear(64, 3),
        )

    runs = {}
    for mode in ("on", "off"):
        model = net()
        config = LocalTrainConfig(epochs=2, batch_size=5, lr=0.05, momentum=0.9, channels_last=mode)
        train_local(model, images(3), config, seed=4, spec=spec(3))
        runs[mode] = model.state_dict()
    assert not torch.equal(runs["on"]["1.running_mean"], net().state_dict()["1.running_mean"])  # it trained
    for name, value in runs["off"].items():
        torch.testing.assert_close(runs["on"][name], value, rtol=1e-5, atol=1e-6)


def test_a_model_that_views_its_feature_maps_is_told_the_setting_and_restored():
    class Viewing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4 * 6 * 6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.conv(x).view(len(x), -1))  # the tutorials' idiom

    model = Viewing()
    with pytest.raises(RuntimeError, match=r"view size.*channels_last: off"):
        train_local(model, images(3), LocalTrainConfig(batch_size=5), seed=0, spec=spec(3))
    assert model.conv.weight.is_contiguous()
    train_local(model, images(3), LocalTrainConfig(batch_size=5, channels_last="off"), seed=0, spec=spec(3))
