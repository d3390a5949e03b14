"""A pretrained HuggingFace ViT in a federated run: LoRA adapters and the new head are all that
travel, and a directory that does not fit the job stops the run before any client trains."""

import pytest
import torch

from raysim.config import JobConfig
from raysim.engine.loop import run
from raysim.errors import ConfigError

BASE = {
    "name": "vit",
    "dataset": {
        "name": "synthetic_images",
        "num_examples": 48,
        "shape": [3, 16, 16],
        "num_classes": 3,
        "partition": {"kind": "iid", "num_clients": 3},
    },
    "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 4, "lr": 0.05}},
    "engine": {"num_rounds": 1, "cohort_size": 3},
    "resources": {"backend": "serial"},
    "tracking": {"enabled": False, "progress": False},
}


def save_tiny(directory, model_type: str) -> None:
    from transformers import ResNetConfig, ResNetModel, ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    if model_type == "vit":
        config = ViTConfig(
            image_size=16,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=1000,
        )
        ViTForImageClassification(config).save_pretrained(directory)
    else:
        ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1])).save_pretrained(directory)


def test_vit_lora_sends_adapters_and_head_only(tmp_path):
    save_tiny(tmp_path / "vit", "vit")
    model = {"name": "hf_vit", "pretrained_path": str(tmp_path / "vit"), "lora": {"r": 4}}
    result = run(JobConfig.from_dict({**BASE, "model": model}), output_dir=tmp_path / "out")
    sent = result.state.params
    head = {name for name in sent if "lora_" not in name}
    assert head == {f"hf.base_model.model.classifier.modules_to_save.default.{p}" for p in ("weight", "bias")}
    # 2 layers x (q_proj, v_proj) x r (32 + 32), and the 3-class head 32 x 3 + 3
    assert sum(v.numel() for v in sent.values()) == 2 * 2 * 4 * (32 + 32) + 32 * 3 + 3
    first = result.history[0][1]
    assert first["sys/bytes_up"] == 3 * sum(v.numel() * 4 for v in sent.values())  # 3 clients


def test_a_directory_of_another_architecture_stops_the_run_before_training(tmp_path):
    save_tiny(tmp_path / "resnet", "resnet")
    model = {"name": "hf_vit", "pretrained_path": str(tmp_path / "resnet")}
    with pytest.raises(ConfigError, match=r"holds a 'resnet' model.*use model name hf_resnet"):
        run(JobConfig.from_dict({**BASE, "model": model}), output_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())
