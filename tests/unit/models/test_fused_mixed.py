"""FuseFL's fused model over towers of different architectures (FuseFL paper, Sec. 6.2, Table 3)
against hand-written torch, and what keeps architectures from being fused."""

import pytest
import torch
import torch.nn.functional as F

from raysim.models import build_model
from raysim.models.fused import FusedConfig, build_fused, fused_net, tower_misfits
from raysim.types import DataSpec

FLAT = DataSpec("classification", (5,), 3)
MNIST = DataSpec("classification", (1, 28, 28), 10)


def mlp(hidden, seed):
    torch.manual_seed(seed)
    return build_model("mlp", {"hidden": list(hidden)}, FLAT).eval()


def test_the_fused_forward_over_different_widths_is_the_hand_written_concatenation():
    """Tower 0 (5-6-4-3) and tower 1 (5-3-4-3) cut after fc1: each adapter reads the 6 + 3
    concatenated features and maps them back to its own tower's width (6, 3) before fc2; the
    features are the sum of the two 4-wide tops; one head (tower 0's)."""
    wide, narrow = mlp((6, 4), 0), mlp((3, 4), 1)
    net = fused_net([wide, narrow], ("fc1",), "conv1x1", FLAT).eval()
    x = torch.randn(7, 5)
    w = net.state_dict()
    lower = [
        F.relu(F.linear(x, m.state_dict()["1.weight"], m.state_dict()["1.bias"])) for m in (wide, narrow)
    ]
    joined = torch.cat(lower, dim=1)  # (7, 6 + 3), in tower order
    tops = []
    for m, model in enumerate((wide, narrow)):
        adapted = F.linear(joined, w[f"stages.1.{m}.adapter.map.weight"], w[f"stages.1.{m}.adapter.map.bias"])
        tops.append(F.relu(F.linear(adapted, model.state_dict()["3.weight"], model.state_dict()["3.bias"])))
    expected = F.linear(tops[0] + tops[1], wide.state_dict()["5.weight"], wide.state_dict()["5.bias"])
    torch.testing.assert_close(net(x), expected)
    assert w["stages.1.0.adapter.map.weight"].shape == (6, 9)
    assert w["stages.1.1.adapter.map.weight"].shape == (3, 9)


def test_the_registered_fused_model_builds_one_tower_per_section():
    sections = ({"name": "mlp", "hidden": [6, 4]}, {"name": "mlp", "hidden": [3, 4]})
    net = build_fused(FusedConfig(towers=sections, splits=("fc1",)), FLAT)
    shapes = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert shapes["stages.0.0.block.0.1.weight"] == (6, 5) and shapes["stages.0.1.block.0.1.weight"] == (3, 5)
    assert shapes["stages.1.1.adapter.map.weight"] == (3, 9)


def test_resnet_10_18_26_align_at_stage_boundaries():
    """The paper's mix (K = 4 after stem, layer2, layer3; and the default, each middle block):
    every depth gives w @28, 2w @14, 4w @7 on MNIST and 8w features."""
    towers = [build_model(name, {"width": 4}, MNIST) for name in ("resnet10", "resnet18", "resnet26")]
    assert tower_misfits(towers, ("stem", "layer2", "layer3"), "conv1x1", MNIST) == []
    assert tower_misfits(towers, ("stem", "layer2", "layer3"), "avg", MNIST) == []
    assert tower_misfits(towers, None, "conv1x1", MNIST) == []


@pytest.mark.parametrize(
    ("towers", "adapter", "expected"),
    [
        ((("resnet10", 4), ("resnet18", 8)), "conv1x1", "top features ([32, 64] values)"),
        (
            (("resnet10", 4), ("resnet18", 8)),
            "avg",
            "split point 1 gives outputs [(8, 14, 14), (16, 14, 14)]",
        ),
        ((("resnet10", 2), ("mlp", 16)), "conv1x1", "split point 1 gives spatial sizes [(4, 14, 14), (16,)]"),
    ],
)
def test_what_does_not_align_is_named(towers, adapter, expected):
    models = [
        build_model(name, {"hidden": [size, size]} if name == "mlp" else {"width": size}, MNIST)
        for name, size in towers
    ]
    assert any(expected in problem for problem in tower_misfits(models, None, adapter, MNIST))
