"""Starting a model from a weights file (raysim/models/weights.py): ``model.init_from``.

Each test writes a real file in ``tmp_path`` from a model built with seed 0, then builds the
same model with seed 1 (so every tensor starts different) and checks it ends up holding exactly
the file's tensors, or that a file that does not fit is refused with every problem listed.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel
from safetensors.torch import save_file

from raysim import params as P
from raysim import registry
from raysim.checkpoint import save_checkpoint
from raysim.config import JobConfig, apply_overrides
from raysim.errors import CheckpointError, ConfigError
from raysim.models import build_model, load_weights
from raysim.models.weights import read_weights
from raysim.runtime.builders import build_job_model
from raysim.types import DataSpec, ServerState

CIFAR = DataSpec("classification", (3, 16, 16), 10)
RESNET = {"width": 4}  # BatchNorm: float running stats travel, num_batches_tracked does not
LM = DataSpec("causal_lm", (8,), 40)


def build(name: str, options: dict, spec: DataSpec = CIFAR, seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(name, options, spec)


def assert_same_tensors(model: torch.nn.Module, expected: dict[str, torch.Tensor], keys=None) -> None:
    own = model.state_dict()
    for key in keys if keys is not None else expected:
        assert torch.equal(own[key], expected[key]), key


@pytest.fixture
def source() -> torch.nn.Module:
    """The model the files are written from: trained a little, so BatchNorm stats are not 0/1."""
    model = build("resnet10", RESNET, seed=0)
    model(torch.randn(4, *CIFAR.input_shape))  # train mode: updates the running statistics
    return model


def test_a_torch_state_dict_is_loaded_entirely(tmp_path, source):
    path = tmp_path / "weights.pt"
    torch.save(source.state_dict(), path)
    fresh = build("resnet10", RESNET)
    assert not torch.equal(fresh.state_dict()["conv1.weight"], source.state_dict()["conv1.weight"])
    loaded = build("resnet10", {**RESNET, "init_from": str(path)})
    assert_same_tensors(loaded, source.state_dict())
    assert loaded.state_dict()["norm1.num_batches_tracked"] == 1  # integer buffers too


def test_a_safetensors_file_is_loaded(tmp_path):
    source = build("cnn_cifar", {}, DataSpec("classification", (3, 32, 32), 10), seed=0)
    path = tmp_path / "model.safetensors"
    save_file(source.state_dict(), path)
    loaded = build("cnn_cifar", {"init_from": str(path)}, DataSpec("classification", (3, 32, 32), 10))
    assert_same_tensors(loaded, source.state_dict())


def test_a_raysim_checkpoint_gives_its_global_params(tmp_path, source):
    """A checkpoint holds what travels: num_batches_tracked is not in it and keeps its built value."""
    path = tmp_path / "final.pt"
    save_checkpoint(path, ServerState(params=P.clone(P.model_params(source))), 3, {"name": "x"})
    loaded = build("resnet10", {**RESNET, "init_from": str(path)})
    assert_same_tensors(loaded, source.state_dict(), keys=P.model_params(source))
    assert loaded.state_dict()["norm1.num_batches_tracked"] == 0


def test_a_prefix_is_stripped_and_a_new_head_skipped(tmp_path, source):
    """A DataParallel-style file ("module." keys) from a 7-class model, under a 10-class head."""
    other = build("resnet10", RESNET, DataSpec("classification", (3, 16, 16), 7), seed=0)
    path = tmp_path / "pretrained.pt"
    torch.save({f"module.{k}": v for k, v in other.state_dict().items()}, path)
    init = {"path": str(path), "strip_prefix": "module.", "skip": ["head.*"]}
    loaded = build("resnet10", {**RESNET, "init_from": init})
    body = [k for k in other.state_dict() if not k.startswith("head.")]
    assert_same_tensors(loaded, other.state_dict(), keys=body)
    assert_same_tensors(loaded, build("resnet10", RESNET).state_dict(), keys=["head.weight", "head.bias"])


def test_one_skip_pattern_may_be_a_plain_string(tmp_path, source):
    weights = {k: v for k, v in source.state_dict().items() if not k.startswith("head.")}
    torch.save(weights, tmp_path / "body.pt")
    model = build("resnet10", RESNET)
    load_weights(model, tmp_path / "body.pt", skip="head.*")
    assert_same_tensors(model, weights)


def test_every_mismatch_is_listed_in_one_error_naming_the_file(tmp_path, source):
    weights = dict(source.state_dict())
    del weights["head.bias"]
    weights["extra.weight"] = torch.zeros(1)
    weights["head.weight"] = torch.zeros(7, 32)
    path = tmp_path / "bad.pt"
    torch.save(weights, path)
    with pytest.raises(CheckpointError) as info:
        load_weights(build("resnet10", RESNET), path)
    message = str(info.value)
    assert message.startswith(f"{path} does not fit the model: ")
    assert "1 missing key: head.bias" in message
    assert "1 unexpected key: extra.weight" in message
    assert "1 mis-shaped key: head.weight (file (7, 32), model (10, 32))" in message
    assert "set strip_prefix" in message and "list them in skip" in message


def test_a_file_is_not_loaded_at_all_when_it_does_not_fit(tmp_path, source):
    weights = dict(source.state_dict())
    del weights["head.bias"]
    torch.save(weights, tmp_path / "partial.pt")
    model = build("resnet10", RESNET)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError):
        load_weights(model, tmp_path / "partial.pt")
    assert_same_tensors(model, before)


def test_long_key_lists_are_cut_with_a_count(tmp_path, source):
    torch.save({f"model.{k}": v for k, v in source.state_dict().items()}, tmp_path / "prefixed.pt")
    with pytest.raises(CheckpointError, match=r"missing keys: .* and \d+ more"):
        load_weights(build("resnet10", RESNET), tmp_path / "prefixed.pt")


def test_a_skip_pattern_that_matches_nothing_is_reported(tmp_path, source):
    torch.save(source.state_dict(), tmp_path / "w.pt")
    with pytest.raises(CheckpointError, match=r"skip patterns \['heads\.\*'\] match no key"):
        load_weights(build("resnet10", RESNET), tmp_path / "w.pt", skip=["heads.*"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a torch file", "not a readable weights file"),
        (
            {"epoch": 3, "model": {"w": torch.zeros(1)}},
            r"holds \{'epoch': 'int', 'model': 'dict'\}, not a state dict",
        ),
        ([torch.zeros(1)], "holds list, not a state dict"),
    ],
)
def test_files_that_are_not_state_dicts(tmp_path, content, message):
    path = tmp_path / "w.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(CheckpointError, match=message):
        load_weights(build("mlp", {}), path)
    with pytest.raises(CheckpointError, match="no weights file at"):
        load_weights(build("mlp", {}), tmp_path / "absent.pt")


def test_build_model_reports_the_config_key(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.init_from: no weights file at .*absent\.pt"):
        build("mlp", {"init_from": str(tmp_path / "absent.pt")})


def test_every_process_builds_the_same_model_even_its_frozen_base(tmp_path):
    """Under LoRA the frozen base never travels: each worker must read it from the file itself."""
    source = build("hf_causal_lm", {"lora": {}}, LM, seed=0)
    path = tmp_path / "lm.pt"
    torch.save(source.state_dict(), path)

    def job(seed: int) -> JobConfig:
        return JobConfig.from_dict(
            {
                "seed": seed,
                "dataset": {"name": "digits"},
                "model": {"name": "hf_causal_lm", "lora": {}, "init_from": str(path)},
                "algorithm": {"name": "fedavg"},
            }
        )

    first, second = build_job_model(job(1), LM), build_job_model(job(2), LM)
    frozen = [name for name, p in first.named_parameters() if not p.requires_grad]
    assert frozen and len(P.model_params(first)) < len(first.state_dict())
    assert_same_tensors(first, source.state_dict())
    assert_same_tensors(second, source.state_dict())


def test_a_lora_checkpoint_holds_only_the_adapters(tmp_path):
    source = build("hf_causal_lm", {"lora": {}}, LM, seed=0)
    with torch.no_grad():
        for tensor in P.model_params(source).values():
            tensor.add_(0.5)  # lora_B starts at zero: make the adapters distinguishable
    path = tmp_path / "final.pt"
    save_checkpoint(path, ServerState(params=P.clone(P.model_params(source))), 0, {})
    loaded = build("hf_causal_lm", {"lora": {}, "init_from": str(path)}, LM, seed=0)
    assert_same_tensors(loaded, source.state_dict())


def test_init_from_in_a_job_section(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = {
        "dataset": {"name": "digits"},
        "model": {"name": "mlp", "init_from": "runs/final.pt"},
        "algorithm": {"name": "fedavg"},
    }
    job = JobConfig.from_dict(raw)
    init = job.model.config.init_from
    assert init.path == tmp_path / "runs" / "final.pt"  # absolute: workers may run elsewhere
    assert init.strip_prefix == "" and init.skip == ()
    assert JobConfig.from_dict(job.to_dict()) == job
    overridden = apply_overrides(raw, ["model.init_from={path: /w.pt, skip: ['head.*']}"])
    assert JobConfig.from_dict(overridden).model.config.init_from.skip == ("head.*",)
    with pytest.raises(
        ConfigError, match=r"model\.init_from\.strip_prefx: unknown key; did you mean 'strip_prefix'"
    ):
        JobConfig.from_dict(
            {**raw, "model": {"name": "mlp", "init_from": {"path": "w.pt", "strip_prefx": "m."}}}
        )


def test_a_model_config_must_take_init_from():
    class Plain(BaseModel, frozen=True, extra="forbid"):
        width: int = 1

    with pytest.raises(TypeError, match="must subclass raysim.models.weights.ModelConfig"):
        registry.register("model", "plain_test_model", config=Plain)(lambda config, spec: None)
    assert "plain_test_model" not in registry.names("model")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty, not a weights file"),
        (bytes(range(256)) * 20, "it is no torch file, or holds objects beyond tensors"),
        ("truncated", "failed reading zip archive: failed finding central directory$"),
    ],
)
def test_an_unreadable_file_is_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "w.pt"
    if content == "truncated":
        torch.save({"w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:500])
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as info:
        load_weights(build("mlp", {}), path)
    assert "\n" not in str(info.value) and "weights_only" not in str(info.value)


def test_weights_holding_nan_are_refused_and_nothing_is_loaded(tmp_path):
    model = build("mlp", {}, seed=0)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    key = sorted(weights)[-1]
    weights[key].view(-1)[0] = float("nan")
    torch.save(weights, tmp_path / "nan.pt")
    fresh = build("mlp", {})
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match=f"nan.pt is non-finite: .*{key}.* hold NaN or infinity"):
        load_weights(fresh, tmp_path / "nan.pt")
    assert_same_tensors(fresh, before)


def test_a_damaged_torch_state_dict_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.arange(4096.0)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside w's bytes: torch.load would read a different weight
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{path} is corrupt: its entry .* does not match"):
        read_weights(path)
