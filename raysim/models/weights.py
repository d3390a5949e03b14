"""Starting a model from a weights file: ``init_from``, an option of every model.

Every model's Config subclasses ``ModelConfig``, so every ``model:`` section takes
``init_from: PATH`` (or ``{path, strip_prefix, skip}``). The model is first built as usual (seeded,
so every process agrees), then the file's tensors are copied in. The file is one of:

- a raysim checkpoint (``raysim run`` writes ``final.pt``): its global params;
- a ``.safetensors`` file;
- a torch state dict (``.pt``, ``.bin``), read with ``weights_only=True``.

A torch file is first checked against its archive's checksums (``check_archive``), naming it.

The file must fit the model: every tensor that travels (``params.model_params``: trainable
parameters and float buffers) must be in it with the model's shape, and it may hold no key the
model lacks. Other state-dict entries (frozen parameters, integer buffers such as BatchNorm's
``num_batches_tracked``) are loaded when present. Every process reads the file itself, so on a
cluster it must be readable on every node (as ``pretrained_path`` must).

Usage:
    model = build_model("resnet18", {"init_from": "runs/x/final.pt"}, spec)
    load_weights(model, "resnet18_imagenet.pt", strip_prefix="module.", skip=("head.*",))
"""

from __future__ import annotations

import fnmatch
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, field_validator, model_validator
from torch import nn

from raysim import params as P
from raysim import registry
from raysim.checkpoint import check_archive, is_checkpoint, parse_state, unreadable
from raysim.errors import CheckpointError

SHOWN = 8  # keys listed per kind of mismatch; the rest are counted


class InitFromConfig(BaseModel, frozen=True, extra="forbid"):
    """A weights file the model starts from; a plain string is taken as its path."""

    path: Path  # made absolute when the job is loaded: workers may run in another directory
    strip_prefix: str = ""  # removed from the file's keys that start with it, e.g. "module."
    skip: tuple[str, ...] = ()  # glob patterns of model keys kept as built, e.g. "head.*" for a new head

    @model_validator(mode="before")
    @classmethod
    def _path_alone(cls, raw: Any) -> Any:
        return {"path": raw} if isinstance(raw, (str, Path)) else raw

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        return path.expanduser().absolute()


class ModelConfig(BaseModel, frozen=True, extra="forbid"):
    """The options every model has; each model's own Config subclasses it."""

    init_from: InitFromConfig | None = None  # None: the seeded initialisation


registry.require_config_base("model", ModelConfig)  # before any model module registers


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The named tensors of a raysim checkpoint, a ``.safetensors`` file or a torch state dict.

    Raises:
        CheckpointError: the file is missing, unreadable, or not a flat mapping of names to tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty, not a weights file (an interrupted copy?)")
    if path.suffix != ".safetensors" and zipfile.is_zipfile(path):  # what torch.save writes
        check_archive(path)  # older pickled torch files have no checksums to check
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path, device="cpu")
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"{path} is not a readable weights file (a raysim checkpoint, .safetensors, or a torch "
            f"state dict saved with torch.save): {unreadable(exc)}"
        ) from exc
    if is_checkpoint(raw):
        return parse_state(raw, path)[0].params  # no client-state snapshot needed
    if not isinstance(raw, dict) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        found = {k: type(v).__name__ for k, v in raw.items()} if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(
            f"{path} holds {str(found)[:200]}, not a state dict (a mapping of names to tensors); "
            "save model.state_dict() itself"
        )
    return raw


@torch.no_grad()
def load_weights(
    model: nn.Module, path: str | Path, *, strip_prefix: str = "", skip: Sequence[str] = ()
) -> None:
    """Copies a weights file into ``model`` in place, after checking it fits.

    Args:
        model: the freshly built model.
        path: a raysim checkpoint, a ``.safetensors`` file or a torch state dict.
        strip_prefix: removed from the start of every file key that has it ("module.").
        skip: glob patterns (``fnmatch``) of model keys that keep their built values; file keys
            they match are ignored (a pretrained backbone under a new head: ``"head.*"``).

    Raises:
        CheckpointError: the file is unreadable, or lists in one message every missing,
            unexpected and mis-shaped key, and every ``skip`` pattern that matches no key; or a
            tensor it would load holds NaN or infinity.
    """
    skip = (skip,) if isinstance(skip, str) else tuple(skip)  # one pattern, not its characters
    own = model.state_dict()
    weights = {key.removeprefix(strip_prefix): value for key, value in read_weights(path).items()}
    weights = {key: value for key, value in weights.items() if not matches(key, skip)}
    required = {key for key in P.model_params(model) if not matches(key, skip)}
    problems = mismatches(weights, own, required)
    unused = [pattern for pattern in skip if not any(matches(key, [pattern]) for key in own)]
    if unused:
        problems.append(f"skip patterns {unused} match no key of the model")
    if problems:
        raise CheckpointError(f"{path} does not fit the model: " + "; ".join(problems))
    if not P.is_finite(weights):  # every client would train from it and diverge, blamed on its lr
        bad = P.nonfinite_names(weights)
        raise CheckpointError(f"{path} is non-finite: {listing(bad)} hold NaN or infinity")
    for key, value in weights.items():
        own[key].copy_(value)


def matches(key: str, patterns: Sequence[str]) -> bool:
    """Whether ``key`` matches one of the glob ``patterns`` (case-sensitive)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def mismatches(
    weights: dict[str, torch.Tensor], own: dict[str, torch.Tensor], required: set[str]
) -> list[str]:
    """One line per kind of mismatch between a file's tensors and a model's state dict."""
    missing = sorted(required - set(weights))
    unexpected = sorted(set(weights) - set(own))
    misshaped = [
        f"{key} (file {tuple(value.shape)}, model {tuple(own[key].shape)})"
        for key, value in sorted(weights.items())
        if key in own and value.shape != own[key].shape
    ]
    problems = [
        f"{len(keys)} {kind} {'key' if len(keys) == 1 else 'keys'}: {listing(keys)}"
        for kind, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
        if keys
    ]
    if missing and unexpected:
        problems.append("if the file's keys carry a prefix (e.g. 'module.'), set strip_prefix")
    if misshaped:
        problems.append("to keep the model's own tensors for some keys (a new head), list them in skip")
    return problems


def listing(items: list[str]) -> str:
    """The first ``SHOWN`` items, and how many more there are."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more
