"""Overrides aimed at one variant (``fedprox:algorithm.mu=1.0``) and the ``!unset`` marker that
drops a key a variant (or an override) would otherwise inherit.

A job file's variants are merged over its base, so a variant inherits every key of the base; one
whose plugin lacks such a key writes ``mu: !unset`` to drop it. An override ``key=value`` applies
to every variant; ``VARIANT:key=value`` to that variant only.

Usage:
    raw = yaml.load(text, Loader=JobLoader)           # ``!unset`` read as UNSET
    per_variant = overrides_for(["fedprox:algorithm.mu=1", "seed=1"], "fedprox", names)
    tree = drop_unset(tree)                            # every UNSET key removed
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from raysim.errors import ConfigError

UNSET_TAG = "!unset"


class _Unset:
    """The value of a key to drop (``key: !unset``)."""

    def __repr__(self) -> str:
        return UNSET_TAG

    def __deepcopy__(self, memo: dict) -> _Unset:  # one marker, compared by identity
        return self


UNSET = _Unset()


class DuplicateKey(yaml.YAMLError):
    """A key written twice in one mapping of a job file or an override."""


class JobLoader(yaml.SafeLoader):
    """YAML's safe loader that also reads ``!unset``, and refuses a key written twice in one
    mapping: YAML keeps the last one silently, so a second ``engine:`` section dropped the first.
    Checked as each mapping is composed, before merge keys (``<<: *base``) copy other mappings'
    keys in, which a key may then override."""

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if (key_node.tag, key_node.value) in seen:
                at = f"line {key_node.start_mark.line + 1}"
                raise DuplicateKey(f"{key_node.value!r} is written twice in one mapping ({at}); keep one")
            seen.add((key_node.tag, key_node.value))
        return node


JobLoader.add_constructor(UNSET_TAG, lambda loader, node: UNSET)


def drop_unset(tree: Any) -> Any:
    """``tree`` without the keys whose value is ``!unset``, at any depth."""
    if isinstance(tree, dict):
        return {key: drop_unset(value) for key, value in tree.items() if value is not UNSET}
    if isinstance(tree, list):
        return [drop_unset(item) for item in tree]
    return tree


def split_target(item: str) -> tuple[str | None, str]:
    """``("fedprox", "algorithm.mu=1")`` for ``fedprox:algorithm.mu=1``; ``(None, item)`` for an
    override of every variant. A ``:`` after the ``=`` belongs to the value (``a={b: 1}``)."""
    key = item.partition("=")[0]
    variant, colon, _ = key.partition(":")
    return (variant, item[len(variant) + 1 :]) if colon else (None, item)


def overrides_for(overrides: Sequence[str], variant: str | None) -> list[str]:
    """The overrides that apply to ``variant``: those of every variant and its own, in order."""
    out = []
    for item in overrides:
        target, override = split_target(item)
        if target is None or target == variant:
            out.append(override)
    return out


def split_sweep(overrides: Sequence[str], source: str) -> tuple[list[str], list[str]]:
    """(the ``sweep.*`` overrides, the others): a sweep section is the file's, not a variant's, so
    its overrides never reach a variant's job (``sweep.seeds=[0]`` shrinks the sweep).

    Raises:
        ConfigError: a ``VARIANT:sweep.*`` override (the sweep is every variant's).
    """
    sweep, rest, problems = [], [], []
    for item in overrides:
        target, override = split_target(item)
        key = override.partition("=")[0]
        if key != "sweep" and not key.startswith("sweep."):
            rest.append(item)
        elif target is not None:
            problems.append(f"override {item!r}: the sweep crosses every variant; drop {target + ':'!r}")
        elif dotted := _dotted_axis(override):
            problems.append(dotted)
        else:
            sweep.append(override)
    if problems:
        raise ConfigError(problems, source)
    return sweep, rest


def _dotted_axis(override: str) -> str | None:
    """Why ``sweep.grid.algorithm.local.lr=[..]`` cannot work (an axis's name has dots, which an
    override's key splits into nested keys), with the whole-grid form that does; None otherwise."""
    key, _, value = override.partition("=")
    for section in ("sweep.grid.", "sweep.random.axes."):
        axis = key[len(section) :] if key.startswith(section) else ""
        if "." in axis:
            whole = f"{section[:-1]}={{{axis}: {value}}}"
            return (
                f"override {override!r}: a sweep axis's name has dots, which an override's key "
                f"cannot hold; set the whole {section[:-1]}: {whole!r} (docs/sweeps.md)"
            )
    return None


def check_targets(overrides: Sequence[str], variants: Sequence[str], source: str) -> None:
    """One error for each ``VARIANT:`` prefix that names no variant of the job file."""
    problems = []
    for item in overrides:
        target, _ = split_target(item)
        if target is None or target in variants:
            continue
        if not variants:
            problems.append(f"override {item!r}: the job has no variants; drop {target + ':'!r}")
        else:
            problems.append(f"override {item!r}: no variant {target!r}; variants: {', '.join(variants)}")
    if problems:
        raise ConfigError(problems, source)
