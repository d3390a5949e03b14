"""Typed plugin state as it is stored: plain values out, the plugin's dataclasses back.

A checkpoint and the client-state store hold plain values only (``params.check_loadable``: what a
weights-only ``torch.load`` reads). Plugin state crosses as the plain dict of its dataclass's
fields (``plain``), under the field names, and comes back as the plugin's type: ``rebuild`` after
the server state ``init`` made for this run, ``from_plain`` for the type a plugin names as its
``ClientState``.

A state dataclass that drops a field names it in ``RETIRED_FIELDS`` (a ``ClassVar[frozenset[str]]``):
a checkpoint an earlier version wrote still holds it, and ``rebuild`` reads past it (SCAFFOLD's
population, now the run's ``RunInfo.num_clients``); any other difference is still refused.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import TYPE_CHECKING, Any, TypeVar, cast

from raysim.params import is_dataclass_instance

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


def plain(tree: object) -> object:
    """``tree`` with every dataclass turned into the dict of its fields (recursively)."""
    if is_dataclass_instance(tree):
        return {f.name: plain(getattr(tree, f.name)) for f in dataclasses.fields(tree) if f.init}
    if isinstance(tree, dict):
        return {k: plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(plain(v) for v in tree)
    return tree


def from_plain(kind: type[T], saved: object, where: str) -> T:
    """A ``kind`` dataclass from the dict of its fields (as ``plain`` wrote it), with the fields
    that are dataclasses themselves (``X`` or ``X | None`` in ``kind``'s annotations) rebuilt too.

    Raises:
        ValueError: ``saved`` is no dict with exactly ``kind``'s fields; names both.
    """
    names = [f.name for f in dataclasses.fields(cast(Any, kind)) if f.init]
    if not isinstance(saved, dict) or set(saved) - retired_fields(kind) != set(names):
        held = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{where} holds {held}, but {kind.__name__} keeps {sorted(names)}")
    hints = _field_hints(cast(type, kind))
    return kind(**{name: _as_field(hints.get(name), saved[name], f"{where}.{name}") for name in names})


@functools.cache
def _field_hints(kind: type) -> dict[str, Any]:
    """``kind``'s resolved annotations, once per class: a worker reads client state per client."""
    return typing.get_type_hints(kind)


def _as_field(hint: object, value: object, where: str) -> object:
    """A field's saved value as its annotated dataclass (the one dataclass in ``X | None``)."""
    options = typing.get_args(hint) or (hint,)
    kinds = [k for k in options if isinstance(k, type) and dataclasses.is_dataclass(k)]
    return from_plain(kinds[0], value, where) if len(kinds) == 1 and isinstance(value, dict) else value


def rebuild(template: T, saved: object, where: str) -> T:
    """``saved`` (plain) rebuilt with the dataclass types of ``template`` (a state of that shape).

    A None template takes None or an empty dict (what a plugin without state saved).

    Raises:
        ValueError: ``saved`` has other fields than ``template``; names both.
    """
    if template is None:
        if saved is None or saved == {}:
            return template
        raise ValueError(f"{where} holds {_shape(saved)}, but this algorithm keeps no state there")
    if is_dataclass_instance(template):
        fields = {
            f.name: rebuild(getattr(template, f.name), v, where) for f, v in _fields(template, saved, where)
        }
        return cast(T, type(template)(**fields))
    return cast(T, saved)


def retired_fields(kind: type) -> frozenset[str]:
    """The fields that earlier versions of the state dataclass ``kind`` kept and it no longer does."""
    retired: frozenset[str] = getattr(kind, "RETIRED_FIELDS", frozenset())
    return retired


def _fields(
    template: DataclassInstance, saved: object, where: str
) -> list[tuple[dataclasses.Field[Any], object]]:
    own = [f for f in dataclasses.fields(template) if f.init]
    if not isinstance(saved, dict) or set(saved) - retired_fields(type(template)) != {f.name for f in own}:
        kind = type(template).__name__
        raise ValueError(f"{where} holds {_shape(saved)}, but {kind} keeps {sorted(f.name for f in own)}")
    return [(f, saved[f.name]) for f in own]


def _shape(saved: object) -> str:
    return str(sorted(saved)) if isinstance(saved, dict) else f"a {type(saved).__name__}"
