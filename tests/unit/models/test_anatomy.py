"""Model anatomy (raysim/models/anatomy.py): features, head, blocks and parameter groups.

``model(x) == model.head(model.features(x))`` must hold bitwise for every registered model, in
eval mode and, from the same RNG state, in train mode (dropout, BatchNorm batch statistics).

Expected groups are read off the layer lists by hand:

- cnn_mnist is conv(0) relu pool conv(3) relu pool flatten linear(7) relu linear(9);
- cnn_pfl is conv(0) relu conv(2) relu pool dropout flatten linear(7) relu dropout linear(10);
- the MLP without hidden layers is flatten linear(1);
- ResNet-10 has one BasicBlock per stage; stages 2-4 change width, so their first block has a
  1x1-conv shortcut with a norm ("shortcut.0", "shortcut.1");
- ResNet-20's widening blocks have parameter-free option-A shortcuts: nothing beyond two convs;
- cnn_digit5 is conv(0) gn(1) relu pool conv(4) gn(5) relu pool conv(8) gn(9) relu pool flatten
  linear(13) relu linear(15) linear(16): the projector is linear(15), the head linear(16) alone.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from raysim import registry
from raysim.errors import ConfigError
from raysim.models import FeatureModel, build_model, param_groups, split_blocks
from raysim.types import DataSpec

MNIST = DataSpec("classification", (1, 28, 28), 10)
CIFAR = DataSpec("classification", (3, 32, 32), 10)
TEXT = DataSpec("classification", (12,), 3, pad_token_id=0)
LM = DataSpec("causal_lm", (12,), 50, pad_token_id=0)
TINY_RESNET = {"width": 4}
SMALL_IMAGES = DataSpec("classification", (3, 64, 64), 7)  # AlexNet's pools need 63x63
RGB16 = DataSpec("classification", (3, 16, 16), 3)
_TINY: dict[str, str] = {}


def tiny_pretrained(kind: str) -> str:
    """A save_pretrained directory of a tiny random ResNet or ViT, written once per session."""
    if kind not in _TINY:
        import atexit
        import shutil
        import tempfile

        from transformers import (
            ResNetConfig,
            ResNetForImageClassification,
            ViTConfig,
            ViTForImageClassification,
        )

        torch.manual_seed(123)
        if kind == "resnet":
            config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
            model = ResNetForImageClassification(config)
        else:
            config = ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64)  # fmt: skip
            model = ViTForImageClassification(config)
        _TINY[kind] = tempfile.mkdtemp(prefix=f"raysim-tiny-{kind}-")
        atexit.register(shutil.rmtree, _TINY[kind], True)
        model.save_pretrained(_TINY[kind])
    return _TINY[kind]


# Every registered model, with the options worth covering; LoRA wraps the HF models in peft.
CASES: dict[str, list[tuple[dict, DataSpec]]] = {
    "mlp": [({}, MNIST), ({"hidden": []}, MNIST)],
    "cnn_mnist": [({}, MNIST)],
    "cnn_fmnist": [({}, MNIST)],
    "cnn_cifar": [({}, CIFAR)],
    "cnn_pfl": [({}, CIFAR)],
    "simple_cnn": [({}, CIFAR), ({}, MNIST)],
    "cnn_digit5": [({}, CIFAR), ({}, MNIST)],
    "vgg11": [({"norm": "none"}, CIFAR), ({"norm": "group", "projector": 8}, CIFAR), ({}, CIFAR)],
    "alexnet_gn": [({}, SMALL_IMAGES)],
    "resnet20": [({}, CIFAR), ({"norm": "none"}, MNIST), ({"norm": "group", "projector": 8}, CIFAR)],
    "resnet10": [(TINY_RESNET, CIFAR)],
    "resnet18": [(TINY_RESNET, CIFAR), ({**TINY_RESNET, "norm": "group", "projector": 8}, CIFAR)],
    "resnet26": [(TINY_RESNET, CIFAR)],
    "fusefl_fused": [
        ({"base": {"name": "resnet10", **TINY_RESNET}, "splits": ["layer2"], "num_towers": 2}, CIFAR),
        ({"base": {"name": "mlp", "hidden": [8]}, "num_towers": 3, "adapter": "avg"}, MNIST),
    ],
    "hf_classifier": [
        ({"arch": arch, **lora}, TEXT)
        for arch in ("bert", "roberta", "distilbert")
        for lora in ({}, {"lora": {}})
    ],
    "hf_causal_lm": [
        ({"arch": arch, **lora}, LM) for arch in ("gpt2", "llama") for lora in ({}, {"lora": {}})
    ],
    # tiny transformers configs saved once (``tiny_pretrained``): the real ResNet/ViT are too big here
    "hf_resnet": [({"pretrained_path": "tiny:resnet", **lora}, RGB16) for lora in ({}, {"lora": {}})],
    "hf_vit": [({"pretrained_path": "tiny:vit", **lora}, RGB16) for lora in ({}, {"lora": {}})],
}
FLAT = [(name, options, spec) for name, cases in CASES.items() for options, spec in cases]
BLOCK_MODELS = [
    case for case in FLAT if not case[0].startswith("hf_") and case[0] != "fusefl_fused"
]  # towers: no blocks


def build(name: str, options: dict, spec: DataSpec) -> nn.Module:
    path = options.get("pretrained_path", "")
    if path.startswith("tiny:"):
        options = {**options, "pretrained_path": tiny_pretrained(path.removeprefix("tiny:"))}
    torch.manual_seed(0)
    return build_model(name, options, spec)


def inputs(spec: DataSpec, batch: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if spec.input_shape == (12,):  # token ids, the last two of the first row padding
        x = torch.randint(1, 30, (batch, 12), generator=generator)
        x[0, -2:] = 0
        return x
    return torch.randn(batch, *spec.input_shape, generator=generator)


def test_every_registered_model_is_covered():
    assert set(CASES) == set(registry.names("model"))


@pytest.mark.parametrize(("name", "options", "spec"), FLAT)
@pytest.mark.parametrize("train", [False, True])
def test_forward_is_the_head_of_the_features_bitwise(name, options, spec, train):
    model = build(name, options, spec).train(train)
    x = inputs(spec)
    with torch.no_grad():
        torch.manual_seed(5)
        logits = model(x)
        torch.manual_seed(5)  # the same dropout masks in train mode
        features = model.features(x)
        from_features = model.head(features)
    assert isinstance(model, FeatureModel)
    assert features.shape[:-1] == logits.shape[:-1]  # (B, D) for classifiers, (B, T, D) for LMs
    assert torch.equal(from_features, logits)


@pytest.mark.parametrize(("name", "options", "spec"), BLOCK_MODELS)
def test_blocks_compose_to_the_model_and_the_last_is_the_head(name, options, spec):
    model = build(name, options, spec).eval()
    blocks = model.blocks()
    x = inputs(spec)
    with torch.no_grad():
        out = x
        for block in blocks.values():
            out = block(out)
        features = x
        for block in list(blocks.values())[:-1]:
            features = block(features)
        expected_features = model.features(x)
        expected = model(x)
    assert list(blocks)[-1] == "head" and blocks["head"] is model.head
    assert torch.equal(features, expected_features)
    assert torch.equal(out, expected)


@pytest.mark.parametrize(("name", "options", "spec"), FLAT)
def test_param_groups_name_every_tensor_once(name, options, spec):
    model = build(name, options, spec)
    groups = param_groups(model)
    names = [key for keys in groups.values() for key in keys]
    assert sorted(names) == sorted(model.state_dict())
    assert len(names) == len(set(names))
    assert list(groups)[-1] == "head" and groups["head"]


def test_cnn_groups_by_hand():
    expected = {
        "conv1": ["0.weight", "0.bias"],
        "conv2": ["3.weight", "3.bias"],
        "fc1": ["7.weight", "7.bias"],
        "head": ["9.weight", "9.bias"],
    }
    assert param_groups(build("cnn_mnist", {}, MNIST)) == expected
    pfl = param_groups(build("cnn_pfl", {}, CIFAR))
    assert pfl == {
        "conv1": ["0.weight", "0.bias"],
        "conv2": ["2.weight", "2.bias"],
        "fc1": ["7.weight", "7.bias"],
        "head": ["10.weight", "10.bias"],
    }
    assert param_groups(build("mlp", {"hidden": []}, MNIST)) == {
        "flatten": [],
        "head": ["1.weight", "1.bias"],
    }


def test_new_cnn_groups_by_hand():
    assert param_groups(build("cnn_digit5", {}, MNIST)) == {
        "conv1": ["0.weight", "0.bias", "1.weight", "1.bias"],
        "conv2": ["4.weight", "4.bias", "5.weight", "5.bias"],
        "conv3": ["8.weight", "8.bias", "9.weight", "9.bias"],
        "fc1": ["13.weight", "13.bias"],
        "projector": ["15.weight", "15.bias"],
        "head": ["16.weight", "16.bias"],
    }
    vgg = param_groups(build("vgg11", {"norm": "none"}, CIFAR))
    assert list(vgg) == [*(f"conv{i}" for i in range(1, 9)), "flatten", "head"]
    assert vgg["conv1"] == ["0.weight", "0.bias"] and vgg["conv2"] == ["3.weight", "3.bias"]
    assert vgg["flatten"] == [] and vgg["head"] == ["22.weight", "22.bias"]


def test_resnet20_option_a_blocks_hold_only_their_convs_and_norms():
    groups = param_groups(build("resnet20", {"norm": "group"}, CIFAR))
    block = "layers.1.0"
    assert groups["layer2.0"] == [
        f"{block}.conv1.weight",
        f"{block}.norm1.weight",
        f"{block}.norm1.bias",
        f"{block}.conv2.weight",
        f"{block}.norm2.weight",
        f"{block}.norm2.bias",
    ]
    assert split_blocks(build("resnet20", {}, CIFAR), "layer2")[0][-1] == "layer2.2"


def test_mlp_without_hidden_layers_has_the_flattened_input_as_features():
    model = build("mlp", {"hidden": []}, MNIST)
    x = inputs(MNIST)
    assert torch.equal(model.features(x), x.reshape(3, 784))


def test_resnet_blocks_and_groups_by_hand():
    model = build("resnet10", TINY_RESNET, CIFAR)
    groups = param_groups(model)
    norm = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert list(groups) == ["stem", "layer1.0", "layer2.0", "layer3.0", "layer4.0", "pool", "head"]
    assert groups["stem"] == ["conv1.weight", *(f"norm1.{n}" for n in norm)]
    block = "layers.1.0"
    assert groups["layer2.0"] == [
        f"{block}.conv1.weight",
        *(f"{block}.norm1.{n}" for n in norm),
        f"{block}.conv2.weight",
        *(f"{block}.norm2.{n}" for n in norm),
        f"{block}.shortcut.0.weight",
        *(f"{block}.shortcut.1.{n}" for n in norm),
    ]
    assert groups["pool"] == [] and groups["head"] == ["head.weight", "head.bias"]
    assert model.features(inputs(CIFAR)).shape == (3, 32)  # 8w channels, pooled


def test_resnet_features_are_the_pooled_last_stage():
    """Recomputed from the modules, with adaptive average pooling instead of a mean."""
    model = build("resnet18", TINY_RESNET, CIFAR).eval()
    x = inputs(CIFAR)
    with torch.no_grad():
        stage4 = model.layers(torch.relu(model.norm1(model.conv1(x))))
        pooled = nn.functional.adaptive_avg_pool2d(stage4, 1).flatten(1)
        assert torch.allclose(model.features(x), pooled, atol=1e-6)


def test_projector_resnet_features_are_the_projector_output_and_the_head_the_classifier():
    model = build("resnet18", {**TINY_RESNET, "norm": "group", "projector": 8}, CIFAR).eval()
    groups = param_groups(model)
    assert list(groups)[-3:] == ["pool", "projector", "head"]
    assert groups["projector"] == ["projector.weight", "projector.bias"]
    assert groups["head"] == ["head.weight", "head.bias"]
    x = inputs(CIFAR)
    with torch.no_grad():
        pooled = model.layers(torch.relu(model.norm1(model.conv1(x)))).mean(dim=(2, 3))
        assert torch.equal(model.features(x), model.projector(pooled))
    assert model.features(x).shape == (3, 8)


@pytest.mark.parametrize(
    ("arch", "head"),
    [
        ("bert", ["hf.classifier.weight", "hf.classifier.bias"]),
        (
            "roberta",
            [f"hf.classifier.{layer}.{p}" for layer in ("dense", "out_proj") for p in ("weight", "bias")],
        ),
        (
            "distilbert",
            [f"hf.{layer}.{p}" for layer in ("pre_classifier", "classifier") for p in ("weight", "bias")],
        ),
    ],
)
def test_classifier_head_is_the_task_head(arch, head):
    groups = param_groups(build("hf_classifier", {"arch": arch}, TEXT))
    assert groups["head"] == head
    assert list(groups) == ["body", "head"]


def test_tied_lm_head_group_holds_the_token_embedding():
    groups = param_groups(build("hf_causal_lm", {"arch": "gpt2"}, LM))
    assert groups["head"] == ["hf.transformer.wte.weight", "hf.lm_head.weight"]


def test_lora_classifier_head_group_holds_the_trained_copy_of_the_head():
    model = build("hf_classifier", {"arch": "bert", "lora": {}}, TEXT)
    prefix = "hf.base_model.model.classifier"
    trained = [f"{prefix}.modules_to_save.default.{p}" for p in ("weight", "bias")]
    frozen = [f"{prefix}.original_module.{p}" for p in ("weight", "bias")]
    assert sorted(param_groups(model)["head"]) == sorted(trained + frozen)


@pytest.mark.parametrize(("arch", "first_token"), [("bert", False), ("roberta", True), ("distilbert", True)])
def test_classifier_features_from_the_hidden_states(arch, first_token):
    """Features against HF's own hidden states: the first token's (RoBERTa, DistilBERT), or
    BERT's pooler tanh(W h_0 + b)."""
    model = build("hf_classifier", {"arch": arch}, TEXT).eval()
    x = inputs(TEXT)
    with torch.no_grad():
        hidden = model.hf(input_ids=x, attention_mask=(x != 0).long(), output_hidden_states=True)
        first = hidden.hidden_states[-1][:, 0]
        expected = first if first_token else torch.tanh(model.hf.bert.pooler.dense(first))
        assert torch.allclose(model.features(x), expected, atol=1e-6)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_lm_features_are_the_last_hidden_state(arch):
    model = build("hf_causal_lm", {"arch": arch}, LM).eval()
    x = inputs(LM)
    with torch.no_grad():
        hidden = model.hf(input_ids=x, attention_mask=(x != 0).long(), output_hidden_states=True)
        assert torch.allclose(model.features(x), hidden.hidden_states[-1], atol=1e-6)


def test_a_copied_head_is_a_separate_head():
    """FedRoD's personal head starts as a copy of the classifier and trains apart from it."""
    model = build("hf_classifier", {"arch": "distilbert"}, TEXT).eval()
    features = model.features(inputs(TEXT)).detach()
    personal = copy.deepcopy(model.head)
    assert torch.equal(personal(features), model.head(features))
    with torch.no_grad():
        next(personal.parameters()).add_(1.0)
    assert not torch.equal(personal(features), model.head(features))


@pytest.mark.parametrize(
    ("name", "point", "lower"),
    [
        ("resnet10", "layer2", ["stem", "layer1.0", "layer2.0"]),
        ("resnet18", "layer2", ["stem", "layer1.0", "layer1.1", "layer2.0", "layer2.1"]),
        ("resnet26", "layer1.1", ["stem", "layer1.0", "layer1.1"]),
        ("resnet18", "stem", ["stem"]),
        ("resnet18", "pool", None),  # all but the head
    ],
)
def test_split_blocks_at_a_block_or_a_stage(name, point, lower):
    model = build(name, TINY_RESNET, CIFAR).eval()
    names = list(model.blocks())
    below, above = split_blocks(model, point)
    assert below == (lower or names[:-1])
    assert above == names[len(below) :]
    blocks = model.blocks()
    x = inputs(CIFAR)
    with torch.no_grad():
        split = nn.Sequential(*(blocks[n] for n in above))(nn.Sequential(*(blocks[n] for n in below))(x))
        assert torch.equal(split, model(x))


def test_freezing_the_lower_blocks_stops_their_params_from_travelling():
    from raysim import params as P

    model = build("cnn_mnist", {}, MNIST)
    below, _ = split_blocks(model, "conv2")
    for name in below:
        model.blocks()[name].requires_grad_(False)
    groups = param_groups(model)
    assert sorted(P.model_params(model)) == sorted(groups["fc1"] + groups["head"])


@pytest.mark.parametrize("point", ["head", "layer5", "layer", "conv1"])
def test_split_points_that_name_no_inner_block_are_config_errors(point):
    with pytest.raises(ConfigError, match=rf"split point '{point}'.*'layer4\.0'.*\['layer1', 'layer2'"):
        split_blocks(build("resnet10", TINY_RESNET, CIFAR), point)


def test_hf_models_split_into_body_and_head():
    assert split_blocks(build("hf_classifier", {}, TEXT), "body") == (["body"], ["head"])


def test_blocks_that_leave_out_tensors_are_reported():
    class Partial(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(2, 2)
            self.head = nn.Linear(2, 2)

        def features(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

        def blocks(self) -> dict[str, nn.Module]:
            return {"head": self.head}

    with pytest.raises(
        ValueError, match=r"Partial.blocks\(\) leaves out tensors \['body.weight', 'body.bias'\]"
    ):
        param_groups(Partial())
