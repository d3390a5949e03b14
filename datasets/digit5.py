"""Digit-Five from local image folders: MNIST, MNIST-M, SVHN, SynthDigits and USPS, one domain
each, the feature-shift benchmark of FedBN, LSS and IMA (Chen et al., NeurIPS 2024,
arXiv:2410.23660; Zhou et al., IEEE TMC 2024, arXiv:2305.07845).

Nothing ships Digit-Five; put it under ``root`` as image folders, one per domain, named as in
FedBN's bundle (``domains``):

    <root>/MNIST/train/<digit>/<image>.png        and  <root>/MNIST/test/<digit>/<image>.png
    <root>/MNIST_M/..., <root>/SVHN/..., <root>/SynthDigits/..., <root>/USPS/...

(or ``<root>/<domain>/<digit>/<image>`` without the split folders: ``test_fraction`` then splits
each client). ``<digit>`` is 0 to 9. Images are converted to ``mode`` (RGB by default: grey MNIST
and USPS get the grey channel three times, beside colour SVHN) and resized to ``size`` x ``size``;
every layout rule is in ``raysim.data.image_folders``. With the split folders, each client's test
split is its domain's test images (its share of them with ``clients_per_domain`` > 1).

Usage:
    store = open_dataset("digit5", Digit5Config(root="data/digit5"))   # 5 clients, one domain each
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import PositiveInt

from raysim.data.image_folders import DomainNames, domain_examples
from raysim.data.partition import DomainPartition, PartitionConfig
from raysim.data.store import DatasetConfig, Examples
from raysim.registry import register

DOMAINS = ("MNIST", "MNIST_M", "SVHN", "SynthDigits", "USPS")


class Digit5Config(DatasetConfig, frozen=True, extra="forbid"):
    """Digit-Five recipe settings.

    Attributes:
        root: the folder holding one folder per domain (relative paths: to the working directory).
        domains: the domain folders to read, in any order (clients follow the sorted names).
        mode: "RGB" (3 channels) or "L" (grey).
        size: the side every image is resized to (the LSS code: 32; IMA: 28).
        max_per_domain: at most this many images of each domain's split (a seeded choice; the
            LSS code draws 25,000 train and 9,000 test images a domain); None keeps all.
        source_split: keep the source's train/test split; False merges a domain's images and
            leaves the split to ``test_fraction`` (the LSS code merges them and splits each
            client 75/25 by label: ``test_fraction: 0.25``, ``stratify_test: true``).
        partition: one client per domain by default; ``domain_dirichlet`` for IMA's label skew
            within each domain.
    """

    root: str
    domains: DomainNames = DOMAINS
    mode: Literal["L", "RGB"] = "RGB"
    size: PositiveInt = 32
    max_per_domain: PositiveInt | None = None
    source_split: bool = True
    partition: PartitionConfig = DomainPartition(column="domain")


@register("dataset", "digit5")
class Digit5:
    """Digit-Five: 10 digit classes in five domains, from local image folders."""

    Config = Digit5Config

    def __init__(self, config: Digit5Config) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Reads every domain's images (key column ``domain``)."""
        cfg = self.config
        size = (cfg.size, cfg.size)
        return domain_examples(
            Path(cfg.root), list(cfg.domains), cfg.mode, size, cfg.max_per_domain, cfg.seed, cfg.source_split
        )
