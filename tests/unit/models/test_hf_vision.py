"""HuggingFace ResNet and ViT (raysim/models/hf_vision.py): tiny configs with random weights saved
to tmp_path with save_pretrained, loaded back offline through raysim.

Sizes by hand. The tiny ViT has width d = 32, 2 layers, 8x8 patches of 16x16 images; LoRA (r = 8)
on "q_proj" and "v_proj" (d -> d) holds 2 layers * 2 * 8 * (32 + 32) = 2,048 numbers, and its head
for 3 classes 32 * 3 + 3 = 99. A LoRA adapter on a k x k convolution from ``in`` to ``out``
channels is peft's conv A (r, in, k, k) and 1x1 conv B (out, r): ``r * (in * k * k + out)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim import params as P
from raysim.errors import ConfigError
from raysim.models import build_model, param_groups
from raysim.models.hf_vision import HFImageModel
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientData, DataSpec

RGB16 = DataSpec("classification", (3, 16, 16), 3)
VIT_ADAPTERS = 2 * 2 * 8 * (32 + 32)  # 2,048
VIT_HEAD = 32 * 3 + 3  # 99


def tiny_resnet_config(num_labels: int = 7, channels: int = 3):
    from transformers import ResNetConfig

    return ResNetConfig(
        num_channels=channels,
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
        num_labels=num_labels,
    )


def tiny_vit_config(num_labels: int = 5, image_size: int = 16):
    from transformers import ViTConfig

    return ViTConfig(
        image_size=image_size,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=num_labels,
    )


def save(model_class, config, directory) -> dict[str, torch.Tensor]:
    """Saves a randomly initialised transformers model; returns its state dict."""
    torch.manual_seed(123)
    model = model_class(config)
    model.save_pretrained(directory)
    return model.state_dict()


def saved_resnet(directory, **options) -> dict[str, torch.Tensor]:
    from transformers import ResNetForImageClassification

    return save(ResNetForImageClassification, tiny_resnet_config(**options), directory)


def saved_vit(directory, **options) -> dict[str, torch.Tensor]:
    from transformers import ViTForImageClassification

    return save(ViTForImageClassification, tiny_vit_config(**options), directory)


def build(name: str, options: dict, spec: DataSpec = RGB16, seed: int = 0) -> HFImageModel:
    torch.manual_seed(seed)
    return build_model(name, options, spec).eval()


def images(batch: int = 2, spec: DataSpec = RGB16) -> torch.Tensor:
    return torch.randn(batch, *spec.input_shape, generator=torch.Generator().manual_seed(0))


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def plain_name(name: str) -> str:
    """The transformers model's name of a tensor of the wrapped (and maybe peft) model."""
    for wrapper in (
        "hf.",
        "base_model.model.",
        ".base_layer",
        ".original_module",
        ".modules_to_save.default",
    ):
        name = name.replace(wrapper, "")
    return name


@pytest.mark.parametrize(("name", "saver"), [("hf_resnet", saved_resnet), ("hf_vit", saved_vit)])
def test_a_pretrained_model_loads_with_a_fresh_head_for_the_jobs_classes(tmp_path, name, saver):
    saved = saver(tmp_path)
    model = build(name, {"pretrained_path": str(tmp_path)})
    state = {plain_name(k): v for k, v in model.state_dict().items()}
    head = {k for k in state if k.startswith("classifier.")}
    assert head and all(state[k].shape[0] == 3 for k in head)  # 3 classes, not the saved 7 or 5
    assert all(saved[k].shape[0] != 3 for k in head)
    body = state.keys() - head
    assert body == saved.keys() - head
    assert all(torch.equal(state[k], saved[k]) for k in body)
    with torch.no_grad():
        logits = model(images())
        assert logits.shape == (2, 3)
        assert torch.equal(model.head(model.features(images())), logits)
    # FedRep, FedBABU and FedRoD find the head by name
    assert {plain_name(k) for k in param_groups(model)["head"]} == head


def test_a_saved_head_for_the_jobs_classes_is_kept(tmp_path):
    saved = saved_vit(tmp_path, num_labels=3)
    model = build("hf_vit", {"pretrained_path": str(tmp_path)})
    assert torch.equal(model.head.weight, saved["classifier.weight"])


def test_a_bare_resnet_backbone_gets_a_head(tmp_path):
    """A ResNetModel directory (no classifier) loads into the classifier's backbone."""
    from transformers import ResNetModel

    saved = save(ResNetModel, tiny_resnet_config(), tmp_path)
    model = build("hf_resnet", {"pretrained_path": str(tmp_path)})
    state = {plain_name(k): v for k, v in model.state_dict().items()}
    assert all(torch.equal(state[f"resnet.{k}"], v) for k, v in saved.items())
    assert state["classifier.1.weight"].shape == (3, 16)
    with torch.no_grad():
        assert model(images()).shape == (2, 3)


def test_from_scratch_sizes_are_resnet18_and_vit_b16():
    """ResNet-18 has 11,689,512 parameters with ImageNet's 1,000 classes (He et al., Table 1's
    1.8 GFLOPs model, torchvision's count), so 11,689,512 - 513 * 1,000 + 513 * 10 with 10; the ViT
    is ViT-B/16's encoder: 12 layers of width 768."""
    spec = DataSpec("classification", (3, 32, 32), 10)
    resnet = build("hf_resnet", {}, spec)
    assert sum(p.numel() for p in resnet.parameters()) == 11_689_512 - 513 * 1000 + 513 * 10
    vit = build("hf_vit", {}, DataSpec("classification", (3, 32, 32), 10))
    config = vit.unwrapped().config
    assert (config.num_hidden_layers, config.hidden_size, config.patch_size) == (12, 768, 16)
    with torch.no_grad():
        assert resnet(images(spec=spec)).shape == (2, 10)


def test_vit_lora_trains_and_sends_only_the_adapters_and_the_head(tmp_path):
    saved = saved_vit(tmp_path)
    model = build("hf_vit", {"pretrained_path": str(tmp_path), "lora": {}})
    params = P.model_params(model)
    head = sorted(k for k in params if not is_adapter(k))
    assert head == ["hf.base_model.model.classifier.modules_to_save.default.bias",
                    "hf.base_model.model.classifier.modules_to_save.default.weight"]  # fmt: skip
    assert P.num_elements(params) == VIT_ADAPTERS + VIT_HEAD
    # the frozen base is the saved model, and a fresh adapter (lora_B = 0) changes no output
    state = model.state_dict()
    base = [k for k in state if not is_adapter(k) and ".classifier." not in k]
    assert base and all(torch.equal(state[k], saved[plain_name(k)]) for k in base)
    before = {k: v.clone() for k, v in state.items()}
    data = ClientData({"x": images(4).numpy(), "y": np.array([0, 1, 2, 0])})
    train_local(model.train(), data, LocalTrainConfig(lr=0.5, batch_size=4, max_steps=1), seed=0, spec=RGB16)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {k for k in params if ".lora_A." not in k}  # lora_A's gradient is 0 while B = 0


def test_resnet_lora_adapts_every_convolution_and_sends_batchnorm_statistics(tmp_path):
    saved_resnet(tmp_path)
    plain = build("hf_resnet", {"pretrained_path": str(tmp_path)})
    model = build("hf_resnet", {"pretrained_path": str(tmp_path), "lora": {"r": 4}})
    convs = [m for n, m in plain.named_modules() if n.endswith(".convolution")]
    expected = sum(4 * (c.in_channels * c.kernel_size[0] * c.kernel_size[1] + c.out_channels) for c in convs)
    params = P.model_params(model)
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    adapters = {k for k in trainable if is_adapter(k)}
    assert P.num_elements({k: params[k] for k in adapters}) == expected
    assert trainable - adapters == {k for k in trainable if ".classifier.modules_to_save." in k}
    buffers = params.keys() - trainable
    assert buffers and all(k.endswith((".running_mean", ".running_var")) for k in buffers)
    with torch.no_grad():
        assert torch.allclose(model(images()), plain(images()), atol=1e-6)


@pytest.mark.parametrize(
    ("name", "saver", "options", "spec", "message"),
    [
        (
            "hf_vit",
            saved_resnet,
            {},
            RGB16,
            r"holds a 'resnet' model, not hf_vit's 'vit'; use model name hf_resnet",
        ),
        ("hf_resnet", saved_vit, {}, RGB16, r"holds a 'vit' model.*use model name hf_vit"),
        (
            "hf_resnet",
            saved_resnet,
            {"depth": 50},
            RGB16,
            r"model\.depth: 50, but .* holds a ResNet-6; set model\.depth=6",
        ),
        (
            "hf_resnet",
            saved_resnet,
            {},
            DataSpec("classification", (1, 16, 16), 3),
            r"model\.pretrained_path: .* reads 3-channel images, the data has 1; set dataset\.mode: RGB",
        ),
        (
            "hf_vit",
            saved_vit,
            {},
            DataSpec("classification", (3, 28, 28), 3),
            r"takes 16x16 images, the data's are 28x28; set dataset\.resize: \[16, 16\]",
        ),
    ],
)
def test_a_pretrained_model_that_does_not_fit_is_one_config_error(
    tmp_path, name, saver, options, spec, message
):
    saver(tmp_path)
    with pytest.raises(ConfigError, match=message) as info:
        build_model(name, {"pretrained_path": str(tmp_path), **options}, spec)
    assert len(info.value.problems) == 1


def test_a_directory_without_a_config_or_an_unknown_hub_id_is_a_config_error(tmp_path, monkeypatch):
    with pytest.raises(
        ConfigError, match=r"model\.pretrained_path: .* has no config\.json .*save_pretrained"
    ):
        build_model("hf_vit", {"pretrained_path": str(tmp_path)}, RGB16)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(
        ConfigError, match=r"is not a local directory and the HuggingFace hub .*unset HF_HUB_OFFLINE"
    ):
        build_model("hf_resnet", {"pretrained_path": "no-such-owner/no-such-resnet"}, RGB16)
