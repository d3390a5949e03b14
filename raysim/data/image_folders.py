"""Multi-domain image classification data from local folders: the ``digit5`` and ``domainnet``
recipes' reader.

One folder per domain under ``root``, each in one of three layouts (checked in this order):

    <root>/<domain>_train.txt, <root>/<domain>_test.txt    split lists, a line per image:
                                  "<path relative to root> <label>" (DomainNet's official lists);
                                  the class is the image's parent folder, the label is not read
    <root>/<domain>/train/<class>/<image>, .../test/<class>/<image>
                                  a split the source fixes (Digit-Five as image folders)
    <root>/<domain>/<class>/<image>
                                  no split: the store's ``test_fraction`` splits each client

Images are .png, .jpg, .jpeg, .bmp, .gif, .tif, .tiff or .webp. Classes are the class folder
names of all domains together, sorted (numerically when every name is a number), so a label
means one class in every domain. Every image is converted to one mode ("RGB" replicates a grey
image's channel: grey MNIST and USPS beside colour SVHN) and resized (bilinear) to one size.

Usage:
    files = list_domain(Path("data/domainnet"), "clipart")
    images = read_images(files, mode="RGB", size=(64, 64))    # (n, 3, 64, 64) uint8
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
from pydantic import AfterValidator, Field

from raysim.data.store import Examples, channel_stats, image_table
from raysim.errors import DataError
from raysim.types import DataSpec

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
SPLITS = ("train", "test")


def _each_once(domains: tuple[str, ...]) -> tuple[str, ...]:
    repeated = sorted({d for d in domains if domains.count(d) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once; list each domain once")
    return domains


# A recipe's ``domains`` setting: folder names under its root, each once.
DomainNames = Annotated[tuple[str, ...], Field(min_length=1), AfterValidator(_each_once)]


@dataclass(frozen=True)
class ImageFile:
    """One image of a domain: where it is, its class folder, and its split if the source fixes one."""

    path: Path
    domain: str
    class_name: str
    is_test: bool | None


def list_domain(root: Path, domain: str) -> list[ImageFile]:
    """Every image of ``domain`` under ``root``, in sorted path order.

    Raises:
        DataError: the domain's folder (or a listed image) is missing, or it holds no images.
    """
    lists = [root / f"{domain}_{split}.txt" for split in SPLITS]
    if any(path.is_file() for path in lists):
        files = [image for path in lists for image in _listed(root, domain, path)]
    elif all((root / domain / split).is_dir() for split in SPLITS):
        files = [image for split in SPLITS for image in _walk(root / domain / split, domain, split == "test")]
    else:
        files = _walk(root / domain, domain, None)
    if not files:
        raise DataError(
            f"dataset.domains: the folder {root / domain} holds no images "
            f"({', '.join(sorted(IMAGE_SUFFIXES))}); put the domain's images there as "
            f"{domain}/<class>/<image> (or {domain}/train/<class>/... and {domain}/test/<class>/...), "
            f"or drop {domain!r} from dataset.domains"
        )
    return files


def _walk(folder: Path, domain: str, is_test: bool | None) -> list[ImageFile]:
    """The images in ``folder``'s class subfolders, in sorted order."""
    if not folder.is_dir():
        raise DataError(
            f"dataset.domains: there is no folder {folder}; put the domain's images there as "
            f"<class>/<image>, or drop {domain!r} from dataset.domains"
        )
    return [
        ImageFile(path, domain, path.parent.name, is_test)
        for path in sorted(folder.glob("*/*"))
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
    ]


def _listed(root: Path, domain: str, split_list: Path) -> list[ImageFile]:
    """The images a split list names, each path relative to ``root``."""
    if not split_list.is_file():
        raise DataError(
            f"dataset.domains: {split_list} is missing but the other split list of {domain!r} is there; "
            f"give both {domain}_train.txt and {domain}_test.txt, or neither (then dataset.test_fraction "
            "splits it)"
        )
    is_test = split_list.stem.endswith("_test")
    files = []
    for number, line in enumerate(split_list.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        path = root / line.split()[0]
        if not path.is_file():
            raise DataError(
                f"{split_list}:{number}: the image {path} does not exist; fix the list or the folder"
            )
        files.append(ImageFile(path, domain, path.parent.name, is_test))
    return files


def class_names(files: list[ImageFile]) -> list[str]:
    """The classes of ``files``, sorted (as numbers when all are numbers): label i is entry i."""
    names = {f.class_name for f in files}
    return sorted(names, key=int) if all(n.isdecimal() for n in names) else sorted(names)


def subsample(files: list[ImageFile], limit: int | None, seed: int) -> list[ImageFile]:
    """At most ``limit`` of ``files`` from each split (a seeded choice, kept in path order)."""
    if limit is None:
        return files
    rng = np.random.default_rng(seed)
    kept: list[ImageFile] = []
    for split in (None, False, True):
        part = [f for f in files if f.is_test is split]
        if len(part) > limit:
            part = [part[i] for i in np.sort(rng.choice(len(part), limit, replace=False))]
        kept += part
    return kept


def read_images(files: list[ImageFile], mode: str, size: tuple[int, int]) -> np.ndarray:
    """(n, C, height, width) uint8: each image converted to ``mode`` ("L" or "RGB") and resized
    (bilinear) to ``size`` = (height, width)."""
    from PIL import Image

    channels = 1 if mode == "L" else 3
    height, width = size
    images = np.empty((len(files), channels, height, width), np.uint8)
    for i, file in enumerate(files):
        try:
            with Image.open(file.path) as image:
                pixels = image.convert(mode).resize((width, height), Image.Resampling.BILINEAR)
        except OSError as e:
            raise DataError(f"{file.path} is not a readable image ({e}); remove or replace it") from e
        array = np.asarray(pixels, dtype=np.uint8)
        images[i] = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)  # (H, W, C) -> (C, H, W)
    return images


def domain_examples(
    root: Path,
    domains: list[str],
    mode: str,
    size: tuple[int, int],
    max_per_domain: int | None,
    seed: int,
    source_split: bool = True,
) -> Examples:
    """Every image of ``domains`` as ``Examples`` with key column ``domain`` (and ``is_test``
    where the source fixes the split and ``source_split`` keeps it), normalised by the training
    images' statistics (all images' when the split is left to the store).

    Raises:
        DataError: ``root`` or a domain is missing or empty, or some domains fix a split and
            others do not.
    """
    if not root.is_dir():
        raise DataError(f"dataset.root: there is no folder {root}; put the data there (layout: docs/data.md)")
    files = [f for d in domains for f in subsample(list_domain(root, d), max_per_domain, seed)]
    fixed = {f.domain for f in files if f.is_test is not None}
    if source_split and fixed and fixed != set(domains):
        raise DataError(
            f"dataset.domains: {', '.join(sorted(fixed))} fix a train/test split and "
            f"{', '.join(sorted(set(domains) - fixed))} do not; give every domain the same layout"
        )
    classes = class_names(files)
    label_of = {name: i for i, name in enumerate(classes)}
    images = read_images(files, mode, size)
    labels = np.array([label_of[f.class_name] for f in files], np.int64)
    keys = {"domain": pa.array([f.domain for f in files], pa.string())}
    is_test = np.array([bool(f.is_test) and source_split for f in files])
    if fixed and source_split:
        keys["is_test"] = pa.array(is_test)
    mean, std = channel_stats(images[~is_test])  # the training images': no test leakage
    spec = DataSpec("classification", tuple(images.shape[1:]), len(classes))
    return Examples(image_table(images, labels, **keys), spec, None, mean, std)
