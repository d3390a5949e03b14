"""The digit5 and domainnet recipes on generated folder trees in their layouts (tiny PNGs)."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raysim.data.partition import DomainDirichletPartition
from raysim.data.prepare import open_dataset
from raysim.engine.domain_scores import client_domains
from raysim.errors import DataError


def png(path: Path, value: int, mode: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (5, 5), value if mode == "L" else (value, 0, value)).save(path)


def digit5_tree(root: Path) -> None:
    """MNIST grey and SVHN colour, 10 digits; per domain and digit 2 train and 1 test image."""
    for domain, mode in (("MNIST", "L"), ("SVHN", "RGB")):
        for digit in range(10):
            for i, split in enumerate(("train", "train", "test")):
                png(root / domain / split / str(digit) / f"{i}.png", 20 * digit + i, mode)


def test_digit5_gives_one_client_per_domain_with_its_test_images(tmp_path, only_loaded_recipes, recipe):
    digit5_tree(tmp_path / "digit5")
    config = recipe("digit5").Digit5Config(
        root=str(tmp_path / "digit5"), domains=("SVHN", "MNIST"), size=8, cache_dir=str(tmp_path / "c")
    )
    store = open_dataset("digit5", config)
    assert store.num_clients == 2 and [store.client_key(c) for c in (0, 1)] == ["MNIST", "SVHN"]
    assert store.num_examples("train").tolist() == [20, 20]  # the test folders, not test_fraction
    assert store.num_examples("test").tolist() == [10, 10]
    assert store.spec.input_shape == (3, 8, 8) and store.spec.num_classes == 10
    assert np.bincount(store.client_data(0, "test").arrays["y"]).tolist() == [1] * 10
    assert client_domains(store, np.array([1, 0])) == {1: "SVHN", 0: "MNIST"}


def test_digit5_with_label_skew_inside_each_domain(tmp_path, only_loaded_recipes, recipe):
    digit5_tree(tmp_path / "digit5")
    config = recipe("digit5").Digit5Config(
        root=str(tmp_path / "digit5"),
        domains=("MNIST", "SVHN"),
        size=8,
        partition=DomainDirichletPartition(column="domain", clients_per_domain=3, alpha=0.5, min_size=3),
        cache_dir=str(tmp_path / "c"),
    )
    store = open_dataset("digit5", config)
    assert [store.client_key(c) for c in range(6)] == ["MNIST"] * 3 + ["SVHN"] * 3
    assert store.num_examples("test").sum() == 20 and store.num_examples("train").sum() == 40
    assert set(client_domains(store, np.arange(6)).values()) == {"MNIST", "SVHN"}


def test_digit5_names_an_empty_domain_folder(tmp_path, only_loaded_recipes, recipe):
    digit5_tree(tmp_path / "digit5")
    (tmp_path / "digit5" / "USPS").mkdir()
    config = recipe("digit5").Digit5Config(
        root=str(tmp_path / "digit5"), domains=("MNIST", "USPS"), cache_dir=str(tmp_path / "c")
    )
    with pytest.raises(DataError, match=r"digit5/USPS holds no images"):
        open_dataset("digit5", config)


def test_repeated_domains_are_a_config_error(recipe):
    with pytest.raises(ValueError, match="MNIST listed more than once"):
        recipe("digit5").Digit5Config(root="x", domains=("MNIST", "SVHN", "MNIST"))


def test_domainnet_follows_the_official_lists(tmp_path, only_loaded_recipes, recipe):
    root = tmp_path / "domainnet"
    for domain in ("clipart", "sketch"):
        lines = {"train": [], "test": []}
        for c, name in enumerate(("airplane", "zebra")):
            for i in range(3):
                png(root / domain / name / f"{domain}_{i}.jpg", 10 * i, "RGB")
                lines["test" if i == 2 else "train"].append(f"{domain}/{name}/{domain}_{i}.jpg {c}")
        for split, listed in lines.items():
            (root / f"{domain}_{split}.txt").write_text("\n".join(listed) + "\n")
    config = recipe("domainnet").DomainNetConfig(
        root=str(root), domains=("sketch", "clipart"), size=6, cache_dir=str(tmp_path / "c")
    )
    store = open_dataset("domainnet", config)
    assert [store.client_key(c) for c in (0, 1)] == ["clipart", "sketch"]
    assert store.num_examples("train").tolist() == [4, 4] and store.num_examples("test").tolist() == [2, 2]
    assert store.spec.input_shape == (3, 6, 6) and store.spec.num_classes == 2


def test_digit5_merged_as_the_lss_code_then_split_by_label(tmp_path, only_loaded_recipes, recipe):
    """source_split false: each domain's 30 images merged; test_fraction 0.2 keeps 6 test rows per
    client, stratified over its 10 digits of 3 images each (0.6 a digit: 6 digits get one)."""
    digit5_tree(tmp_path / "digit5")
    config = recipe("digit5").Digit5Config(
        root=str(tmp_path / "digit5"),
        domains=("MNIST", "SVHN"),
        size=8,
        source_split=False,
        test_fraction=0.2,
        stratify_test=True,
        cache_dir=str(tmp_path / "c"),
    )
    store = open_dataset("digit5", config)
    assert store.num_examples("test").tolist() == [6, 6] and store.num_examples("train").tolist() == [24, 24]
    for client in (0, 1):
        assert np.bincount(store.client_data(client, "test").arrays["y"], minlength=10).max() == 1
