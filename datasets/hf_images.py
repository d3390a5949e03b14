"""Image classification data through HuggingFace ``datasets``: CIFAR-10/100, FMNIST, EMNIST,
DomainNet-style folders, or local parquet / image folders.

``path`` is what ``datasets.load_dataset`` takes: a hub id ("uoft-cs/cifar10") when the machine
has the hub or a cache of it, or a builder ("parquet", "imagefolder") with ``data_files``. Images
become uint8 (C, H, W) arrays: ``mode`` (or else the first image's mode) decides grayscale (1
channel) or RGB (3), and every image is converted to it. ``resize`` and ``center_crop`` then bring
the images to one size (bilinear, as torchvision's ``Resize`` on PIL images, then its
``CenterCrop``); without them all images must have one size. Per-channel mean/std come from the
train split.

Usage:
    config = HfImagesConfig(path="uoft-cs/cifar10", partition=DirichletPartition(alpha=0.1))
    store = open_dataset("hf_images", config)
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, PositiveInt, model_validator

from raysim.data.hub import load_split
from raysim.data.store import DatasetConfig, Examples, channel_stats, image_table
from raysim.errors import DataError
from raysim.registry import register
from raysim.types import DataSpec

GRAYSCALE_MODES = {"1", "L", "LA", "I", "I;16", "F"}
_BATCH = 256  # images decoded per step of the conversion loop


class HfImagesConfig(DatasetConfig, frozen=True, extra="forbid"):
    """HuggingFace image recipe settings.

    Attributes:
        path: hub id or builder name, passed to ``datasets.load_dataset``.
        subset: the dataset's configuration name (e.g. "byclass" for EMNIST), if any (HF calls
            it `name`; in a job `name:` picks the recipe).
        data_files: local files for builders such as "parquet" or "imagefolder".
        train_split: split partitioned into clients.
        test_split: split used as the central test set; None for none.
        image_column: column of images.
        label_column: column of integer class labels.
        domain_column: column kept as a key column (as text) for the ``domain`` partitioner.
        max_examples: keep only the first rows of each split (quick runs).
        mode: "L" (grayscale) or "RGB" for every image; None takes the first image's. Digit-Five
            mixes grey MNIST/USPS with colour SVHN: "RGB" replicates the grey channel.
        resize: [height, width] every image is resized to (bilinear), e.g. FedGuCci's Fashion-MNIST
            at 32x32 for VGG-11; None keeps the sizes.
        center_crop: side of the square cut from the centre after ``resize``, e.g. PACS's 224 out
            of 256; None keeps the whole image.
    """

    path: str
    subset: str | None = None
    data_files: dict[str, str | list[str]] | str | list[str] | None = None
    train_split: str = "train"
    test_split: str | None = "test"
    image_column: str = "img"
    label_column: str = "label"
    domain_column: str | None = None
    max_examples: int | None = Field(None, gt=0)
    # Left out of dumps when unset: the store cache path hashes the dump, and stores prepared
    # before these options existed must keep theirs.
    mode: Literal["L", "RGB"] | None = Field(None, exclude_if=lambda value: value is None)
    resize: tuple[PositiveInt, PositiveInt] | None = Field(None, exclude_if=lambda value: value is None)
    center_crop: PositiveInt | None = Field(None, exclude_if=lambda value: value is None)

    @model_validator(mode="after")
    def _crop_fits_the_resize(self) -> "HfImagesConfig":
        if self.center_crop is not None and self.resize is not None and self.center_crop > min(self.resize):
            raise ValueError(
                f"center_crop {self.center_crop} is larger than the resized {self.resize[0]}x"
                f"{self.resize[1]} images; lower center_crop or raise resize"
            )
        return self


@register("dataset", "hf_images")
class HfImages:
    """Image classification datasets loaded with HuggingFace datasets.load_dataset."""

    Config = HfImagesConfig

    def __init__(self, config: HfImagesConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Loads the train (and test) split and converts the images to uint8 arrays."""
        cfg = self.config
        train = self._load(cfg.train_split)
        images, labels = _images(train, cfg.image_column, cfg), _labels(train, cfg.label_column)
        keys = {}
        if cfg.domain_column is not None:
            keys[cfg.domain_column] = pa.array(_domains(train, cfg.domain_column), pa.string())
        central, all_labels = None, [labels]
        if cfg.test_split is not None:
            test = self._load(cfg.test_split)
            mode = "L" if images.shape[1] == 1 else "RGB"  # the train split's
            test_images, test_labels = (
                _images(test, cfg.image_column, cfg.model_copy(update={"mode": mode})),
                _labels(test, cfg.label_column),
            )
            if test_images.shape[1:] != images.shape[1:]:
                raise DataError(
                    f"{cfg.path}: test images are {test_images.shape[1:]}, train images {images.shape[1:]}"
                )
            central, all_labels = image_table(test_images, test_labels), [labels, test_labels]
        mean, std = channel_stats(images)
        spec = DataSpec(
            "classification",
            tuple(images.shape[1:]),
            _num_classes(train, cfg.label_column, all_labels),
        )
        return Examples(image_table(images, labels, **keys), spec, central, mean, std)

    def _load(self, split: str) -> Any:
        """One split as a ``datasets.Dataset``, capped at ``max_examples`` rows."""
        import datasets  # imported here: ~2 s, and only building a store needs it

        cfg = self.config
        ds = load_split(
            cfg.path,
            cfg.subset,
            split=split,
            data_files=cfg.data_files,
            local_hint="give local files (path: parquet or imagefolder, data_files: {train: ...})",
        )
        for column in (cfg.image_column, cfg.label_column, cfg.domain_column):
            if column is not None and column not in ds.column_names:
                raise DataError(
                    f"{cfg.path} split {split!r} has no column {column!r} "
                    f"(columns: {', '.join(ds.column_names)})"
                )
        if not isinstance(ds.features[cfg.image_column], datasets.Image):
            ds = ds.cast_column(cfg.image_column, datasets.Image())  # paths or {bytes, path} structs
        if cfg.max_examples is not None and len(ds) > cfg.max_examples:
            ds = ds.select(range(cfg.max_examples))
        return ds


def _images(ds: Any, column: str, cfg: HfImagesConfig) -> np.ndarray:
    """(n, C, H, W) uint8 images; ``cfg.mode`` None takes "L" or "RGB" from the first image."""
    images, mode = None, cfg.mode
    rows = ds.select_columns([column]).iter(batch_size=_BATCH)
    for i, image in enumerate(image for batch in rows for image in batch[column]):
        if mode is None:
            mode = "L" if image.mode in GRAYSCALE_MODES else "RGB"
        image = _resized(image if image.mode == mode else image.convert(mode), cfg)
        array = np.asarray(image, dtype=np.uint8)
        array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)  # (H, W, C) -> (C, H, W)
        if images is None:
            images = np.empty((len(ds), *array.shape), np.uint8)  # preallocated: no list of arrays
        elif array.shape != images.shape[1:]:
            raise DataError(
                f"image {i} of column {column!r} is {array.shape[1]}x{array.shape[2]}, the first "
                f"is {images.shape[2]}x{images.shape[3]}: all images must have one size "
                "(set dataset.resize: [height, width])"
            )
        images[i] = array
    if images is None:
        raise DataError(f"column {column!r} holds no images")
    return images


def _resized(image: Any, cfg: HfImagesConfig) -> Any:
    """The PIL image resized (bilinear) to ``cfg.resize``, then cropped to ``cfg.center_crop``.

    The crop's corner is torchvision's ``CenterCrop``: round((size - crop) / 2) on each axis.
    """
    from PIL import Image

    if cfg.resize is not None:
        height, width = cfg.resize
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    if cfg.center_crop is not None:
        crop, (width, height) = cfg.center_crop, image.size
        if crop > min(width, height):
            raise DataError(
                f"center_crop {crop} is larger than a {height}x{width} image; set dataset.resize "
                "or lower dataset.center_crop"
            )
        top, left = round((height - crop) / 2), round((width - crop) / 2)
        image = image.crop((left, top, left + crop, top + crop))
    return image


def _labels(ds: Any, column: str) -> np.ndarray:
    return np.asarray(ds[column], dtype=np.int64)


def _domains(ds: Any, column: str) -> list[str]:
    """Domain of each row as text; class-label domains by their names."""
    feature = ds.features[column]
    values = list(ds[column])
    return [feature.int2str(v) for v in values] if hasattr(feature, "int2str") else [str(v) for v in values]


def _num_classes(ds: Any, column: str, labels: list[np.ndarray]) -> int:
    """From the ClassLabel feature when there is one, else the largest label seen plus one."""
    feature = ds.features[column]
    if hasattr(feature, "num_classes"):
        return int(feature.num_classes)
    return int(max(int(y.max()) for y in labels if len(y)) + 1)
