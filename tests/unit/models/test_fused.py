"""FuseFL's fused model against hand-written torch: the towers, the concatenating adapters, the
sum of the towers' features (or their mean), and the paper's Table 4 size."""

import pytest
import torch
import torch.nn.functional as F

from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.fused import (
    ConcatAdapter,
    FusedConfig,
    build_fused,
    client_stages,
    fused_net,
    middle_split,
    num_parameters,
)
from raysim.types import DataSpec

FLAT = DataSpec("classification", (5,), 3)
CIFAR = DataSpec("classification", (3, 32, 32), 10)


def mlps(count, hidden=(6, 4)):
    models = []
    for seed in range(count):
        torch.manual_seed(seed)
        models.append(build_model("mlp", {"hidden": list(hidden)}, FLAT).eval())
    return models


@pytest.mark.parametrize("fusion", ["sum", "mean"])
def test_the_fused_forward_is_the_hand_written_concatenation(fusion):
    """Eq. 4-6 with conv1x1 (here linear) adapters: tower m's fc2 reads [h_1, ..., h_M] through
    its own adapter; the features are the towers' sum (the official code's), or their mean, the
    scale of one tower, which each client's head trained on; one head."""
    models = mlps(3)
    net = fused_net(models, ("fc1",), "conv1x1", FLAT, fusion).eval()
    x = torch.randn(7, 5)
    w = net.state_dict()
    lower = [F.relu(F.linear(x, m.state_dict()["1.weight"], m.state_dict()["1.bias"])) for m in models]
    joined = torch.cat(lower, dim=1)  # (7, 3 * 6), in tower order
    tops = []
    for m, model in enumerate(models):
        adapted = F.linear(joined, w[f"stages.1.{m}.adapter.map.weight"], w[f"stages.1.{m}.adapter.map.bias"])
        tops.append(F.relu(F.linear(adapted, model.state_dict()["3.weight"], model.state_dict()["3.bias"])))
    features = (tops[0] + tops[1] + tops[2]) / (3 if fusion == "mean" else 1)
    expected = F.linear(features, models[0].state_dict()["5.weight"], models[0].state_dict()["5.bias"])
    torch.testing.assert_close(net.features(x), features)
    torch.testing.assert_close(net(x), expected)
    assert w["stages.1.0.adapter.map.weight"].shape == (6, 18)


def test_the_average_adapter_feeds_every_tower_the_mean():
    models = mlps(2)
    net = fused_net(models, ("fc1",), "avg", FLAT).eval()
    x = torch.randn(4, 5)
    lower = [F.relu(F.linear(x, m.state_dict()["1.weight"], m.state_dict()["1.bias"])) for m in models]
    mean = (lower[0] + lower[1]) / 2
    tops = [F.relu(F.linear(mean, m.state_dict()["3.weight"], m.state_dict()["3.bias"])) for m in models]
    torch.testing.assert_close(net.features(x), tops[0] + tops[1])
    assert not any("adapter" in name for name in net.state_dict())


def test_a_conv1x1_adapter_mixes_the_concatenated_channels():
    adapter = ConcatAdapter(in_channels=6, out_channels=2, spatial=True)
    towers = [torch.randn(3, 2, 4, 4), torch.randn(3, 4, 4, 4)]
    joined = torch.cat(towers, dim=1)
    weight, bias = adapter.map.weight[:, :, 0, 0], adapter.map.bias
    expected = torch.einsum("oc,bchw->bohw", weight, joined) + bias[None, :, None, None]
    torch.testing.assert_close(adapter(towers), expected)


def test_one_stage_without_adapters_gives_the_ensembles_features():
    """K = 1: each tower is its client's model unchanged, the fused feature their sum."""
    torch.manual_seed(0)
    models = [build_model("resnet10", {"width": 4}, CIFAR).eval() for _ in range(3)]
    net = fused_net(models, (), "conv1x1", CIFAR).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        towers = net.tower_outputs(x)
        own = [model.features(x) for model in models]
        for tower, features in zip(towers, own):
            torch.testing.assert_close(tower.flatten(1), features)
        torch.testing.assert_close(net.features(x), sum(own))
    assert not any("adapter" in name for name in net.state_dict())


# the authors' code's split points for K = 8
K8 = ("stem", "layer1.0", "layer1.1", "layer2.0", "layer3.0", "layer4.0", "layer4.1")


@pytest.mark.parametrize(
    ("splits", "mib"), [(("layer2",), 53.71), (("stem", "layer2", "layer3"), 55.38), (K8, 68.08)]
)
def test_the_fused_resnet18_has_the_papers_table_4_size(splits, mib):
    """Table 4 (M = 5, width 32, 10 classes): parameters in MiB of float32 (FuseFL paper, Table 4)."""
    torch.manual_seed(0)
    net = build_fused(FusedConfig(base={"name": "resnet18", "width": 32}, splits=splits, num_towers=5), CIFAR)
    assert num_parameters(net) * 4 / 2**20 == pytest.approx(mib, abs=0.005)


def test_stages_follow_the_split_points_and_the_default_is_the_middle():
    model = build_model("resnet18", {"width": 4}, CIFAR)
    assert middle_split(model) == ("layer2.1",)  # the end of layer2: the paper's K = 2
    stages = client_stages(model, ("stem", "layer2"))
    assert [len(stage) for stage in stages] == [1, 4, 5]  # stem | layer1-2 | layer3-4, pool


@pytest.mark.parametrize(
    ("splits", "message"), [(("layer9",), "'layer9'"), (("layer3", "layer2"), "bottom-up")]
)
def test_a_split_point_the_model_lacks_is_refused_by_name(splits, message):
    model = build_model("resnet10", {"width": 4}, CIFAR)
    with pytest.raises(ConfigError, match=message):
        client_stages(model, splits)
