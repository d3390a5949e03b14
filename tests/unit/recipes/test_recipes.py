"""Dataset recipes in datasets/: mnist, digits, synthetic_images, hf_images (on local parquet)."""

from __future__ import annotations

import os

# Before anything imports HuggingFace `datasets`, which reads these once: a failing hub lookup
# otherwise hangs for ~50 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from raysim.data.partition import DirichletPartition, DomainPartition, IidPartition  # noqa: E402
from raysim.data.prepare import open_dataset  # noqa: E402
from raysim.errors import DataError  # noqa: E402


def x_of(table) -> np.ndarray:
    return table.column("x").combine_chunks().flatten().to_numpy()


def test_mnist_holds_out_a_stratified_central_test(recipe):
    mnist = recipe("mnist")
    examples = mnist.Mnist(mnist.MnistConfig()).load_examples()
    assert examples.table.num_rows == 4000 and examples.central_test.num_rows == 1000
    assert np.bincount(examples.central_test.column("y").to_numpy()).tolist() == [100] * 10
    assert np.bincount(examples.table.column("y").to_numpy()).tolist() == [400] * 10
    assert examples.spec.input_shape == (1, 28, 28) and examples.spec.num_classes == 10
    pixels = x_of(examples.table)
    assert pixels.dtype == np.uint8 and pixels.max() == 255 and len(pixels) == 4000 * 784
    assert examples.mean == (0.1307,) and examples.std == (0.3081,)


def test_mnist_sets_pretraining_digits_apart_from_the_clients(recipe):
    """pretrain_size: 1000 splits the 4,000 client digits into 3,000 and 1,000 (100 per class),
    disjoint and together the default's 4,000, with the default's central test set either way."""
    mnist = recipe("mnist")
    whole = mnist.Mnist(mnist.MnistConfig()).load_examples()
    clients = mnist.Mnist(mnist.MnistConfig(pretrain_size=1000)).load_examples()
    pretrain = mnist.Mnist(mnist.MnistConfig(pretrain_size=1000, part="pretrain")).load_examples()
    assert (clients.table.num_rows, pretrain.table.num_rows) == (3000, 1000)
    assert np.bincount(pretrain.table.column("y").to_numpy()).tolist() == [100] * 10

    def rows(examples) -> list[bytes]:
        return [row.tobytes() for row in x_of(examples.table).reshape(-1, 784)]

    assert not set(rows(clients)) & set(rows(pretrain))
    assert sorted(rows(clients) + rows(pretrain)) == sorted(rows(whole))
    for examples in (clients, pretrain):
        assert examples.central_test.equals(whole.central_test)


def test_mnist_defaults_keep_the_stores_hash_and_bad_parts_are_refused(recipe):
    mnist = recipe("mnist")
    assert not {"pretrain_size", "part"} & mnist.MnistConfig().model_dump().keys()
    with pytest.raises(ValueError, match="part 'pretrain' needs digits set apart: set pretrain_size > 0"):
        mnist.MnistConfig(part="pretrain")
    with pytest.raises(ValueError, match="leave no digit of the 5,000 for the clients; lower pretrain_size"):
        mnist.MnistConfig(pretrain_size=4000)


def test_mnist_store_end_to_end(tmp_path, only_loaded_recipes, recipe):
    mnist = recipe("mnist")
    partition = DirichletPartition(num_clients=20, alpha=0.5)
    store = open_dataset("mnist", mnist.MnistConfig(cache_dir=str(tmp_path), partition=partition))
    assert store.num_clients == 20
    assert store.num_examples("train").sum() + store.num_examples("test").sum() == 4000
    central = store.central_test()
    assert central.arrays["x"].shape == (1000, 1, 28, 28)
    # Normalised with MNIST's statistics: these digits' mean pixel is ~0.13, so about zero.
    assert abs(float(central.arrays["x"].mean())) < 0.1
    assert store.label_histogram(0).sum() == store.num_examples("train")[0]


def test_digits_rescales_to_uint8(recipe):
    digits = recipe("digits")
    examples = digits.Digits(digits.DigitsConfig()).load_examples()
    assert examples.table.num_rows == 1797 and examples.central_test is None
    pixels = x_of(examples.table)
    assert pixels.max() == 255 and pixels.min() == 0  # 16 -> 255, 0 -> 0
    assert set(np.unique(pixels).tolist()) <= {round(v * 255 / 16) for v in range(17)}
    assert 0.2 < examples.mean[0] < 0.4 and 0.3 < examples.std[0] < 0.45
    held = digits.Digits(digits.DigitsConfig(central_test_size=100)).load_examples()
    assert held.table.num_rows == 1697 and held.central_test.num_rows == 100


def test_digits_store(tmp_path, only_loaded_recipes, recipe):
    digits = recipe("digits")
    config = digits.DigitsConfig(cache_dir=str(tmp_path), partition=IidPartition(num_clients=10))
    store = open_dataset("digits", config)
    data = store.client_data(0, "train")
    assert data.arrays["x"].shape == (len(data), 1, 8, 8)
    assert store.num_examples("train")[0] + store.num_examples("test")[0] == 180  # 1797 / 10


def test_synthetic_images_are_seeded(recipe):
    synthetic = recipe("synthetic_images")
    config = synthetic.SyntheticImagesConfig(num_examples=300, shape=(3, 8, 8), central_test_size=50)
    first, again = (synthetic.SyntheticImages(config).load_examples() for _ in range(2))
    other = synthetic.SyntheticImages(config.model_copy(update={"seed": 1})).load_examples()
    assert first.table.equals(again.table) and first.central_test.equals(again.central_test)
    assert not first.table.equals(other.table)
    assert first.table.num_rows == 300 and first.central_test.num_rows == 50
    assert first.spec.input_shape == (3, 8, 8) and len(first.mean) == 3
    assert set(first.table.column("y").to_numpy().tolist()) == set(range(10))


@pytest.fixture
def hf_offline(monkeypatch, tmp_path):
    """HuggingFace offline, caching under tmp_path; returns the `datasets` module."""
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }.items():
        monkeypatch.setenv(name, value)
    import datasets

    # `datasets` fixed its cache path when first imported, maybe before this test: point it here.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    return datasets


def write_parquet(datasets, path, images, labels, domains=None) -> str:
    """A local parquet file with HF's Image and ClassLabel features, as the hub serves them."""
    from PIL import Image

    columns = {"img": [Image.fromarray(a) for a in images], "label": labels}
    if domains is not None:
        columns["domain"] = domains
    ds = datasets.Dataset.from_dict(columns).cast_column("img", datasets.Image())
    ds.cast_column("label", datasets.ClassLabel(num_classes=5)).to_parquet(path)
    return str(path)


def test_hf_images_on_local_parquet(tmp_path, hf_offline, recipe):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (12, 4, 6, 3), dtype=np.uint8)  # (n, H, W, C) as PIL gives
    test = rng.integers(0, 256, (3, 4, 6, 3), dtype=np.uint8)
    files = {
        "train": write_parquet(
            hf_offline,
            tmp_path / "train.parquet",
            train,
            [i % 5 for i in range(12)],
            ["a", "b"] * 6,
        ),
        "test": write_parquet(hf_offline, tmp_path / "test.parquet", test, [0, 1, 2], ["a"] * 3),
    }
    hf = recipe("hf_images")
    config = hf.HfImagesConfig(path="parquet", data_files=files, domain_column="domain")
    examples = hf.HfImages(config).load_examples()
    assert examples.spec.input_shape == (3, 4, 6) and examples.spec.num_classes == 5
    assert np.array_equal(x_of(examples.table), train.transpose(0, 3, 1, 2).ravel())
    assert examples.table.column("domain").to_pylist() == ["a", "b"] * 6
    assert np.array_equal(x_of(examples.central_test), test.transpose(0, 3, 1, 2).ravel())
    assert np.allclose(examples.mean, (train / 255).mean(axis=(0, 1, 2)))
    assert np.allclose(examples.std, (train / 255).std(axis=(0, 1, 2)))


def test_hf_images_domain_store_and_grayscale(tmp_path, hf_offline, only_loaded_recipes, recipe):
    gray = np.arange(8 * 5 * 5, dtype=np.uint8).reshape(8, 5, 5)
    files = {
        "train": write_parquet(hf_offline, tmp_path / "g.parquet", gray, [0, 1] * 4, ["x"] * 3 + ["y"] * 5)
    }
    hf = recipe("hf_images")
    config = hf.HfImagesConfig(
        path="parquet",
        data_files=files,
        test_split=None,
        domain_column="domain",
        partition=DomainPartition(column="domain"),
        test_fraction=0.0,
        cache_dir=str(tmp_path / "c"),
    )
    store = open_dataset("hf_images", config)
    assert store.spec.input_shape == (1, 5, 5)
    assert [store.client_key(c) for c in range(2)] == ["x", "y"]
    assert store.num_examples("train").tolist() == [3, 5]
    assert store.central_test() is None


def test_hf_images_of_different_sizes_are_an_error(tmp_path, hf_offline, recipe):
    images = [np.zeros((4, 4, 3), np.uint8), np.zeros((5, 4, 3), np.uint8)]
    files = {"train": write_parquet(hf_offline, tmp_path / "t.parquet", images, [0, 1])}
    hf = recipe("hf_images")
    config = hf.HfImagesConfig(path="parquet", data_files=files, test_split=None)
    with pytest.raises(DataError, match="one size"):
        hf.HfImages(config).load_examples()


def test_hf_images_mode_resize_and_center_crop(tmp_path, hf_offline, recipe):
    from PIL import Image

    grey = np.arange(2 * 8 * 12, dtype=np.uint8).reshape(2, 8, 12)  # (n, H, W): 8 high, 12 wide
    test = np.full((1, 6, 9), 7, np.uint8)  # another size: resize brings it to the train's
    files = {
        "train": write_parquet(hf_offline, tmp_path / "train.parquet", grey, [0, 1]),
        "test": write_parquet(hf_offline, tmp_path / "test.parquet", test, [1]),
    }
    hf = recipe("hf_images")
    config = hf.HfImagesConfig(path="parquet", data_files=files, mode="RGB", resize=(4, 6))
    examples = hf.HfImages(config).load_examples()
    assert examples.spec.input_shape == (3, 4, 6)  # [height, width], grey replicated to RGB
    expected = np.stack([np.asarray(Image.fromarray(g).resize((6, 4), Image.BILINEAR)) for g in grey])
    assert np.array_equal(x_of(examples.table), np.repeat(expected[:, None], 3, axis=1).ravel())
    assert np.array_equal(x_of(examples.central_test), np.full(3 * 4 * 6, 7, np.uint8))

    # A centre crop alone: torchvision's corner, round((8 - 4) / 2) = 2 down, round((12 - 4) / 2) = 4 right.
    config = hf.HfImagesConfig(path="parquet", data_files=files, test_split=None, mode="L", center_crop=4)
    cropped = hf.HfImages(config).load_examples()
    assert cropped.spec.input_shape == (1, 4, 4)
    assert np.array_equal(x_of(cropped.table), grey[:, 2:6, 4:8].ravel())


def test_hf_images_resize_options_are_checked_and_left_out_of_the_store_hash(recipe):
    hf = recipe("hf_images")
    with pytest.raises(ValueError, match="center_crop 300 is larger than the resized 256x256"):
        hf.HfImagesConfig(path="x", resize=(256, 256), center_crop=300)
    # Unset, the new options stay out of the dump the store cache hashes: old stores keep their path.
    assert not {"mode", "resize", "center_crop"} & set(hf.HfImagesConfig(path="x").model_dump())
    assert hf.HfImagesConfig(path="x", resize=[32, 32]).model_dump()["resize"] == (32, 32)
