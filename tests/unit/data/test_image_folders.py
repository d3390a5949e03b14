"""Multi-domain image folders (Digit-Five and DomainNet layouts) on trees of tiny PNGs written here."""

from pathlib import Path

import pytest
from PIL import Image

from raysim.data.image_folders import class_names, domain_examples, list_domain, read_images, subsample
from raysim.errors import DataError


def png(path: Path, value: int, mode: str = "L", size: int = 4) -> None:
    """A flat image: every pixel ``value`` (RGB: the channels value, value // 2, 0)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    color = value if mode == "L" else (value, value // 2, 0)
    Image.new(mode, (size, size), color).save(path)


def digit_tree(root: Path) -> None:
    """grey/train: 2 of class 0 and 1 of class 1, grey/test: 1 of class 1; colour/train: 1 of
    class 0, colour/test: 1 of class 0 (6x6 RGB)."""
    png(root / "grey/train/0/a.png", 10)
    png(root / "grey/train/0/b.png", 20)
    png(root / "grey/train/1/c.png", 30)
    png(root / "grey/test/1/d.png", 40)
    png(root / "colour/train/0/e.png", 100, "RGB", 6)
    png(root / "colour/test/0/f.png", 200, "RGB", 6)


def test_split_folders_mark_test_images_and_grey_becomes_three_equal_channels(tmp_path):
    digit_tree(tmp_path)
    examples = domain_examples(tmp_path, ["grey", "colour"], "RGB", (8, 8), None, seed=0)
    table = examples.table
    assert table.column("domain").to_pylist() == ["grey"] * 4 + ["colour"] * 2
    assert table.column("is_test").to_pylist() == [False, False, False, True, False, True]
    assert table.column("y").to_pylist() == [0, 0, 1, 1, 0, 0]
    x = table.column("x").combine_chunks().flatten().to_numpy().reshape(6, 3, 8, 8)
    assert (x[3] == 40).all()  # a flat grey 40 resized stays 40 in all three channels
    assert (x[4, 0] == 100).all() and (x[4, 1] == 50).all() and (x[4, 2] == 0).all()
    assert examples.spec.input_shape == (3, 8, 8) and examples.spec.num_classes == 2
    # statistics of the four training images only: channel 0 holds 10, 20, 30 and 100
    assert examples.mean[0] == pytest.approx((10 + 20 + 30 + 100) / 4 / 255)


def test_official_lists_decide_the_split_and_which_images_count(tmp_path):
    """DomainNet's layout: only the listed images are read; the label in a line is not used."""
    for name in ("clipart/cat/1.png", "clipart/cat/2.png", "clipart/dog/3.png", "clipart/dog/unlisted.png"):
        png(tmp_path / name, 50)
    (tmp_path / "clipart_train.txt").write_text("clipart/cat/1.png 0\nclipart/dog/3.png 1\n")
    (tmp_path / "clipart_test.txt").write_text("clipart/cat/2.png 0\n\n")
    files = list_domain(tmp_path, "clipart")
    assert [(f.path.name, f.class_name, f.is_test) for f in files] == [
        ("1.png", "cat", False),
        ("3.png", "dog", False),
        ("2.png", "cat", True),
    ]


def test_a_domain_without_split_folders_or_lists_leaves_the_split_to_the_store(tmp_path):
    png(tmp_path / "sketch/b/1.png", 1)
    png(tmp_path / "sketch/a/2.png", 2)
    (tmp_path / "sketch/a/notes.txt").write_text("not an image")
    examples = domain_examples(tmp_path, ["sketch"], "L", (4, 4), None, seed=0)
    assert "is_test" not in examples.table.column_names
    assert examples.table.column("y").to_pylist() == [0, 1]  # a/2.png, b/1.png
    assert examples.spec.input_shape == (1, 4, 4)


def test_an_empty_domain_folder_is_one_error_naming_the_folder_and_the_fix(tmp_path):
    digit_tree(tmp_path)
    (tmp_path / "USPS" / "3").mkdir(parents=True)
    with pytest.raises(
        DataError, match=r"the folder .*USPS holds no images .*drop 'USPS' from dataset.domains"
    ):
        domain_examples(tmp_path, ["grey", "USPS"], "RGB", (8, 8), None, seed=0)


def test_missing_folders_lists_and_images_are_named(tmp_path):
    with pytest.raises(DataError, match="dataset.root: there is no folder"):
        domain_examples(tmp_path / "nowhere", ["a"], "RGB", (8, 8), None, seed=0)
    with pytest.raises(DataError, match=r"there is no folder .*absent"):
        list_domain(tmp_path, "absent")
    png(tmp_path / "real/cat/1.png", 5)
    (tmp_path / "real_train.txt").write_text("real/cat/1.png 0\n")
    with pytest.raises(DataError, match="real_test.txt is missing"):
        list_domain(tmp_path, "real")
    (tmp_path / "real_test.txt").write_text("real/cat/gone.png 0\n")
    with pytest.raises(DataError, match=r"real_test.txt:1: the image .*gone.png does not exist"):
        list_domain(tmp_path, "real")


def test_domains_must_share_one_layout(tmp_path):
    digit_tree(tmp_path)
    png(tmp_path / "flat/0/x.png", 7)
    with pytest.raises(DataError, match="grey fix a train/test split and flat do not"):
        domain_examples(tmp_path, ["grey", "flat"], "RGB", (8, 8), None, seed=0)


def test_numeric_classes_sort_as_numbers_and_subsampling_caps_each_split(tmp_path):
    for i in range(5):
        png(tmp_path / f"d/train/{'10' if i % 2 else '2'}/{i}.png", i)
    png(tmp_path / "d/test/2/t.png", 9)
    files = list_domain(tmp_path, "d")
    assert class_names(files) == ["2", "10"]
    kept = subsample(files, 2, seed=0)
    assert [f.is_test for f in kept] == [False, False, True]
    assert set(kept[:2]) <= set(files[:5]) and subsample(files, 2, seed=0) == kept
    assert read_images(kept[2:], "L", (2, 3)).shape == (1, 1, 2, 3)


def test_a_broken_image_names_its_file(tmp_path):
    (tmp_path / "d/0").mkdir(parents=True)
    (tmp_path / "d/0/bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"bad.png is not a readable image"):
        domain_examples(tmp_path, ["d"], "L", (4, 4), None, seed=0)
