"""tools/digit_domain_folders.py writes Digit-Five's folder layout from MNIST and the UCI digits."""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))

import digit_domain_folders  # noqa: E402


def test_each_class_sends_its_share_to_test_and_images_keep_their_pixels(tmp_path):
    """Class 0: 5 images, round(5 * 0.4) = 2 to test; class 1: 3 images, round(1.2) = 1."""
    images = np.arange(8 * 4, dtype=np.uint8).reshape(8, 2, 2) * 7
    labels = np.array([0, 1, 0, 0, 1, 0, 1, 0])
    digit_domain_folders.write_domain(tmp_path, images, labels, 0.4, seed=0)
    counts = {
        (split, digit): len(list((tmp_path / split / digit).glob("*.png")))
        for split in ("train", "test")
        for digit in ("0", "1")
    }
    assert counts == {("train", "0"): 3, ("test", "0"): 2, ("train", "1"): 2, ("test", "1"): 1}
    for path in tmp_path.glob("*/*/*.png"):  # named by its row: the same pixels and class
        row = int(path.stem)
        assert np.array_equal(np.asarray(Image.open(path)), images[row])
        assert int(path.parent.name) == labels[row]


def test_the_command_writes_both_domains(tmp_path, capsys):
    assert digit_domain_folders.main([str(tmp_path), "--limit", "30"]) == 0
    for domain in ("mnist", "ucidigits"):
        files = list((tmp_path / domain).glob("*/*/*.png"))
        assert len(files) == 30
    assert Image.open(next((tmp_path / "mnist").glob("*/*/*.png"))).size == (28, 28)
    assert Image.open(next((tmp_path / "ucidigits").glob("*/*/*.png"))).size == (8, 8)
