"""A pydantic Config's options as ``raysim ls`` shows them: ``summary_lines`` for its overview
(``name: type = default``, the allowed values of a ``Literal`` in place of its type, a nested
section as the names of its options) and ``flatten`` for its detail (every option as the dotted
key a job file or an override uses, with type, default, allowed values and description: the
field's ``description``, else its entry in the Config's ``Attributes:`` docstring section, else
the comment on its line).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

SECTION_NAMES = 4  # a nested section in the overview: its first option names, then "+N"


@dataclass(frozen=True)
class Option:
    """One row of the detail table: a dotted key and what it takes."""

    key: str
    type: str
    default: str
    allowed: str
    description: str


def summary_lines(config: type[BaseModel], skip_kind: bool = False) -> list[str]:
    """``name: type = default`` for each option; a nested section as its options' names (and
    its kind, for a section of several kinds)."""
    lines = []
    for name, field in config.model_fields.items():
        if skip_kind and name == "kind":
            continue
        value = None if field.is_required() else field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            default = f" = {getattr(value, 'kind')}" if "kind" in type(value).model_fields else ""
        else:
            default = "" if field.is_required() else f" = {_show(value)}"
        lines.append(f"{name}: {_type(field.annotation)}{default}")
    return lines


def flatten(config: type[BaseModel], prefix: str = "", default: Any = None) -> Iterator[Option]:
    """The options of ``config`` (its values ``default``, if given) as dotted keys; a section
    whose default is set is flattened, under the default's own kind for a tagged union."""
    from raysim.config import PluginSection

    docs = descriptions(config)
    for name, field in config.model_fields.items():
        value = (
            getattr(default, name) if default is not None else field.get_default(call_default_factory=True)
        )
        key = f"{prefix}{name}"
        if isinstance(value, PluginSection):  # a plugin's section: {name: ..., **its options}
            yield Option(f"{key}.name", "str", value.name, "", docs.get(name, ""))
            yield from flatten(type(value.config), f"{key}.", value.config)
            continue
        if isinstance(value, BaseModel):
            members = _models(field.annotation)
            if len(members) > 1 and "kind" in type(value).model_fields:  # a tagged union
                other = ", ".join(_member_signature(m) for m in members if m is not type(value))
                off = f"{key}: null turns it off" if _allows_none(field.annotation) else ""
                kinds = " | ".join(map(kind_of, members))
                about = _sentences(docs.get(name, ""), f"Other kinds: {other}", off)
                yield Option(f"{key}.kind", "str", _show(getattr(value, "kind")), kinds, about)
                yield from (o for o in flatten(type(value), f"{key}.", value) if o.key != f"{key}.kind")
            else:
                yield from flatten(type(value), f"{key}.", value)
            continue
        choices = _literal_choices(field.annotation)
        allowed = " | ".join(map(_show, choices)) if choices else _constraints(field)
        description = docs.get(name, "")
        members = _models(field.annotation)
        if len(members) > 1:  # a section of several kinds, off by default: what each one takes
            description = _sentences(description, f"One of {', '.join(map(_member_signature, members))}")
        if len(members) == 1:  # a section, off by default: its options once it is set
            description = _sentences(description, f"When set, it takes {key}.* below:")
        shown = "required" if field.is_required() and default is None else _show(value)
        kind = _base_type(field.annotation) if choices else _type(field.annotation)
        yield Option(key, kind, shown, allowed, description)
        if len(members) == 1:
            yield from flatten(members[0], f"{key}.")


def _type(annotation: Any) -> str:
    """A compact name of a field's type: ``int``, ``tuple[int, ...]``, ``{epochs, lr, ...}``,
    ``{iid|dirichlet}`` (a section of several kinds), ``a|b`` (a Literal), ``X | null``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return "|".join(map(_show, args))
    if origin in (typing.Union, types.UnionType):
        models = [a for a in args if _is_model(a)]
        if len(models) > 1:
            rest = [_type(a) for a in args if not _is_model(a)]
            return " | ".join(["{" + "|".join(map(kind_of, models)) + "}", *rest])
        return " | ".join(_type(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if _is_model(annotation):  # a section: the names of its first options
        names = list(annotation.model_fields)
        more = [f"+{len(names) - SECTION_NAMES}"] if len(names) > SECTION_NAMES else []
        return "{" + ", ".join(names[:SECTION_NAMES] + more) + "}" if annotation is not BaseModel else "{...}"
    return getattr(annotation, "__name__", str(annotation)).lower() if annotation is not None else "any"


def _base_type(annotation: Any) -> str:
    """The type of a Literal's values (``str``), keeping ``| null``."""
    parts = []
    for arg in (
        get_args(annotation) if get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    ):
        if get_origin(arg) is Literal:
            parts.append(" | ".join(sorted({type(v).__name__ for v in get_args(arg)})))
        else:
            parts.append(_type(arg))
    return " | ".join(parts)


def _literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """A Literal's values (also inside ``X | None``), or None."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    if get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in get_args(annotation):
            if get_origin(arg) is Literal:
                return get_args(arg)
    return None


def _constraints(field: FieldInfo) -> str:
    """``>= 1``, ``> 0, < 1``, ``len >= 1``, a pattern's alternatives; also inside ``X | None``."""
    metadata = list(field.metadata)
    for arg in get_args(field.annotation):
        if get_origin(arg) is typing.Annotated:
            metadata += list(get_args(arg)[1:])
    words = []
    for item in metadata:
        for attribute, symbol in (
            ("ge", ">="),
            ("gt", ">"),
            ("le", "<="),
            ("lt", "<"),
            ("min_length", "len >="),
        ):
            if getattr(item, attribute, None) is not None:
                words.append(f"{symbol} {getattr(item, attribute)}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            simple = re.fullmatch(r"\^\(([\w|]+)\)\$", pattern)
            words.append(simple.group(1).replace("|", " | ") if simple else f"matches {pattern}")
    return ", ".join(words)


def _show(value: Any) -> str:
    """A value as a job file writes it: ``null``, ``true``, ``[200, 200]``, ``sgd``."""
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"))
    if isinstance(value, str):
        return value if value else '""'
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def _sentences(*parts: str) -> str:
    """Non-empty parts joined as sentences."""
    return " ".join(p if p.endswith((".", ":", ";")) else f"{p}." for p in parts if p)


def _allows_none(annotation: Any) -> bool:
    return get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in get_args(annotation)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The section types an annotation allows (``A | B | None`` -> [A, B])."""
    if get_origin(annotation) is typing.Annotated:
        return _models(get_args(annotation)[0])
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _models(arg)]
    return [annotation] if _is_model(annotation) and annotation is not BaseModel else []


def kind_of(model: type[BaseModel]) -> str:
    """A union member's ``kind`` (its Literal default), else its class name."""
    field = model.model_fields.get("kind")
    return str(field.default) if field is not None and isinstance(field.default, str) else model.__name__


def _member_signature(model: type[BaseModel]) -> str:
    """``dirichlet(num_clients, alpha, min_size, max_size)``: a kind and its options."""
    return f"{kind_of(model)}({', '.join(n for n in model.model_fields if n != 'kind')})"


def first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def descriptions(config: type[BaseModel]) -> dict[str, str]:
    """Each field's description: its ``Field(description=...)``, else its ``Attributes:`` entry in
    a docstring of the class or a base, else the comment on the line that declares it."""
    found: dict[str, str] = {}
    for cls in reversed(config.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        found.update(_comments(cls))
        found.update(_attribute_docs(cls.__doc__ or ""))
    for name, field in config.model_fields.items():
        if field.description:
            found[name] = field.description
    return {name: " ".join(text.split()) for name, text in found.items() if name in config.model_fields}


def _attribute_docs(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section, continuation lines joined."""
    found: dict[str, str] = {}
    lines = inspect.cleandoc(doc).splitlines()
    if "Attributes:" not in lines:
        return found
    current = None
    for line in lines[lines.index("Attributes:") + 1 :]:
        if not line.strip():
            continue
        if not line.startswith(" "):
            break  # the next section
        entry = re.match(r"^ {2,4}(\w+)(?: \([^)]*\))?: (.*)$", line)
        if entry:
            current = entry.group(1)
            found[current] = entry.group(2)
        elif current is not None:
            found[current] += " " + line.strip()
    return found


def _comments(cls: type) -> dict[str, str]:
    """``# comment`` at the end of a field's declaring line in the class's source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # no source at hand (a class made at run time)
        return {}
    pattern = re.compile(r"^ {4}(\w+): [^#\n]*#\s*(.+)$", re.MULTILINE)
    tool_comments = ("noqa", "type:", "fmt:")
    return {
        m.group(1): m.group(2).strip()
        for m in pattern.finditer(source)
        if not m.group(2).startswith(tool_comments)
    }
