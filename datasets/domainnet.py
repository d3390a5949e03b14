"""DomainNet from local image folders: 345 classes in six domains (clipart, infograph, painting,
quickdraw, real, sketch), one domain per client, the feature-shift benchmark of LSS's Table 2
(Chen et al., NeurIPS 2024, arXiv:2410.23660; Peng et al., ICCV 2019, arXiv:1812.01754).

Nothing ships DomainNet; unpack the official archives under ``root`` as they come, with the
official split lists beside the domain folders:

    <root>/clipart/<class>/<image>.jpg, <root>/infograph/<class>/..., ...
    <root>/clipart_train.txt, <root>/clipart_test.txt, ...    lines "clipart/<class>/<image>.jpg <label>"

With the lists, each client's test split is its domain's official test images (its share of
them with ``clients_per_domain`` > 1) and ``test_fraction`` is not used; without them the
store's ``test_fraction`` splits each client. Images are read as RGB and resized to ``size`` x
``size`` (the LSS code: 64); every layout rule is in ``raysim.data.image_folders``. The LSS paper
uses 5 of the 6 domains without saying which; ``domains`` defaults to dropping quickdraw (our
choice; the authors' code builds all 6).

Usage:
    store = open_dataset("domainnet", DomainNetConfig(root="data/domainnet"))
"""

from __future__ import annotations

from pathlib import Path

from pydantic import PositiveInt

from raysim.data.image_folders import DomainNames, domain_examples
from raysim.data.partition import DomainPartition, PartitionConfig
from raysim.data.store import DatasetConfig, Examples
from raysim.registry import register

DOMAINS = ("clipart", "infograph", "painting", "real", "sketch")


class DomainNetConfig(DatasetConfig, frozen=True, extra="forbid"):
    """DomainNet recipe settings.

    Attributes:
        root: the folder holding the domain folders and split lists (relative paths: to the
            working directory).
        domains: the domains to read (clients follow the sorted names); "quickdraw" is the sixth.
        size: the side every image is resized to.
        max_per_domain: at most this many images of each domain's split (a seeded choice);
            None keeps all.
        source_split: keep the source's train/test split; False merges a domain's images and
            leaves the split to ``test_fraction`` (the LSS code merges them and splits each
            client 75/25 by label: ``test_fraction: 0.25``, ``stratify_test: true``).
        partition: one client per domain by default.
    """

    root: str
    domains: DomainNames = DOMAINS
    size: PositiveInt = 64
    max_per_domain: PositiveInt | None = None
    source_split: bool = True
    partition: PartitionConfig = DomainPartition(column="domain")


@register("dataset", "domainnet")
class DomainNet:
    """DomainNet: 345 classes in six domains, from local image folders and the official lists."""

    Config = DomainNetConfig

    def __init__(self, config: DomainNetConfig) -> None:
        self.config = config

    def load_examples(self) -> Examples:
        """Reads every domain's images (key column ``domain``; ``is_test`` from the lists)."""
        cfg = self.config
        size = (cfg.size, cfg.size)
        return domain_examples(
            Path(cfg.root), list(cfg.domains), "RGB", size, cfg.max_per_domain, cfg.seed, cfg.source_split
        )
