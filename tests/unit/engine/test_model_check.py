"""A model that does not fit its dataset is a ConfigError before training, not a round-0 failure."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from raysim.data.partition import Partition
from raysim.data.prepare import write_store
from raysim.data.store import ClientStore, Examples, image_table
from raysim.engine.model_check import CHECK_TOKENS, check_model_fits
from raysim.errors import ConfigError
from raysim.types import DataSpec

ROWS = 4


def store_of(tmp_path, name: str, table: pa.Table, spec: DataSpec) -> ClientStore:
    part = Partition(order=np.arange(ROWS), sizes=[2, 2])
    return ClientStore.open(write_store(Examples(table, spec), part, 0.0, seed=0, path=tmp_path / name))


@pytest.fixture
def cifar100(tmp_path) -> ClientStore:
    """Four 3x32x32 images of a 100-class task."""
    images = np.random.default_rng(0).integers(0, 256, (ROWS, 3, 32, 32), dtype=np.uint8)
    return store_of(
        tmp_path, "img", image_table(images, np.arange(ROWS)), DataSpec("classification", (3, 32, 32), 100)
    )


@pytest.fixture
def token_labels(tmp_path) -> ClientStore:
    """Variable-length token rows (ids up to 49) padded to 8, two classes: a GLUE-like store."""
    tokens = pa.array([[1, 5, 9], [2, 49], [3, 4, 5, 6, 7], [8]], pa.list_(pa.int32()))
    table = pa.table({"x": tokens, "y": pa.array([0, 1, 0, 1], pa.int64())})
    return store_of(tmp_path, "tok", table, DataSpec("classification", (8,), 2, pad_token_id=0))


@pytest.fixture
def lm_store(tmp_path) -> ClientStore:
    """Packed sequences of 32 tokens of a 50-token vocabulary (no labels)."""
    rows = np.random.default_rng(1).integers(0, 50, (ROWS, 32)).astype(np.int32)
    x = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), 32)
    return store_of(tmp_path, "lm", pa.table({"x": x}), DataSpec("causal_lm", (32,), 50))


class Mnist1x28(nn.Module):
    """A CNN whose layers are fixed for 1x28x28 images and 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 5)
        self.head = nn.Linear(4 * 24 * 24, 10)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def linear_head(inputs: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, classes))


class TokenClassifier(nn.Module):
    def __init__(self, vocab: int, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 4)
        self.head = nn.Linear(4, classes)

    def forward(self, x):
        return self.head(self.embed(x).mean(1))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, outputs: int | None = None, length: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 4)
        self.head = nn.Linear(4, outputs or vocab)
        self.length = length  # a model that only takes sequences of this length

    def forward(self, x):
        if self.length is not None and x.shape[1] != self.length:
            raise ValueError(f"sequences must have {self.length} tokens, got {x.shape[1]}")
        return self.head(self.embed(x))


def mismatch(model_name: str, dataset: str) -> str:
    return f"model: '{model_name}' does not fit dataset '{dataset}'"


def test_a_cnn_for_1x28x28_on_3x32x32_images_names_both_shapes(cifar100):
    with pytest.raises(ConfigError) as e:
        check_model_fits(Mnist1x28(), cifar100, "cnn_fixed", "cifar100")
    assert mismatch("cnn_fixed", "cifar100") in str(e.value)
    assert "(classification, input (3, 32, 32), 100 classes)" in str(e.value)
    assert "it fails on inputs of shape (2, 3, 32, 32) (torch.float32) like the data's" in str(e.value)
    assert "RuntimeError" in str(e.value)


def test_a_10_class_head_on_a_100_class_store_names_both_shapes(cifar100):
    with pytest.raises(ConfigError, match=r"returns \(2, 10\), where the data needs \(2, 100\)"):
        check_model_fits(linear_head(3 * 32 * 32, 10), cifar100, "m", "cifar100")
    check_model_fits(linear_head(3 * 32 * 32, 100), cifar100, "m", "cifar100")


def test_a_vocabulary_smaller_than_the_data_names_the_size_to_give(token_labels):
    assert token_labels.meta["max_token_id"] == 49  # recorded when the store was written
    with pytest.raises(ConfigError) as e:
        check_model_fits(TokenClassifier(vocab=30), token_labels, "tok", "glue")
    assert "its token embedding takes ids below 30, the data's vocabulary has 50 (IndexError" in str(e.value)
    assert "model.vocab_size=50" in str(e.value)
    check_model_fits(TokenClassifier(vocab=50), token_labels, "tok", "glue")


def test_a_language_model_is_checked_against_the_vocabulary_and_sequence(lm_store):
    with pytest.raises(ConfigError, match="takes ids below 40, the data's vocabulary has 50"):
        check_model_fits(TinyLM(vocab=40, outputs=50), lm_store, "lm", "c4")
    with pytest.raises(ConfigError) as e:
        check_model_fits(TinyLM(vocab=50, outputs=40), lm_store, "lm", "c4")
    assert f"returns (2, {CHECK_TOKENS}, 40), where the data needs (2, {CHECK_TOKENS}, 50)" in str(e.value)
    assert "(causal_lm, input (32,), 50 token vocabulary)" in str(e.value)
    check_model_fits(TinyLM(vocab=50), lm_store, "lm", "c4")
    # a model that takes only the full length is retried with it, not rejected for the short batch
    check_model_fits(TinyLM(vocab=50, length=32), lm_store, "lm", "c4")
    with pytest.raises(ConfigError, match="sequences must have 64 tokens, got 16"):
        check_model_fits(TinyLM(vocab=50, length=64), lm_store, "lm", "c4")


def test_regression_takes_one_output_per_row_or_a_column(tmp_path):
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(ROWS * 3, np.float32)), 3)
    store = store_of(
        tmp_path,
        "r",
        pa.table({"x": x, "y": pa.array(np.ones(ROWS, np.float32))}),
        DataSpec("regression", (3,), 1),
    )
    check_model_fits(nn.Linear(3, 1), store, "m", "stsb")
    check_model_fits(nn.Sequential(nn.Linear(3, 1), nn.Flatten(0)), store, "m", "stsb")  # (B,)
    with pytest.raises(ConfigError, match=r"returns \(2, 2\), where the data needs \(2, 1\)"):
        check_model_fits(nn.Linear(3, 2), store, "m", "stsb")


def test_the_check_leaves_weights_buffers_mode_and_random_state_alone(cifar100):
    model = nn.Sequential(
        nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2), nn.Dropout(0.5), nn.Flatten(), nn.Linear(2 * 30 * 30, 100)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    check_model_fits(model, cifar100, "m", "cifar100")
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_built_in_models_fit_their_stores(cifar100, token_labels):
    from raysim.models import build_model

    for name in ("mlp", "cnn_cifar", "resnet20"):
        check_model_fits(build_model(name, {}, cifar100.spec), cifar100, name, "cifar100")


def test_an_hf_classifier_with_a_smaller_vocabulary_is_caught(token_labels):
    from raysim.models import build_model

    small = build_model("hf_classifier", {"vocab_size": 30}, token_labels.spec)
    with pytest.raises(ConfigError, match=r"takes ids below 30.*\(hf_classifier: model.vocab_size=50\)"):
        check_model_fits(small, token_labels, "hf_classifier", "glue")
    check_model_fits(
        build_model("hf_classifier", {"vocab_size": 50}, token_labels.spec),
        token_labels,
        "hf_classifier",
        "glue",
    )


def test_open_parts_refuses_a_mismatched_model_before_any_worker_or_run(monkeypatch):
    """open_parts runs before build starts workers or a tracking run (engine/build.py)."""
    from raysim import registry
    from raysim.config import JobConfig
    from raysim.engine import build
    from raysim.models import ModelConfig

    class FixedConfig(ModelConfig, frozen=True, extra="forbid"):
        """A 3-class linear model for 8x8 images, whatever the data."""

    registry.load_builtins()
    monkeypatch.setitem(
        registry._entries["model"],
        "fixed_test_model",
        registry.Entry("model", "fixed_test_model", lambda config, spec: linear_head(64, 3), FixedConfig, ""),
    )
    job = JobConfig.from_dict(
        {
            "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 5}},
            "model": {"name": "fixed_test_model"},
            "algorithm": {"name": "fedavg"},
            "engine": {"cohort_size": 2},
            "resources": {"backend": "serial"},
            "tracking": {"enabled": False},
        }
    )
    with pytest.raises(
        ConfigError, match=r"'fixed_test_model' does not fit dataset 'digits'.*needs \(2, 10\)"
    ):
        build.open_parts(job)
