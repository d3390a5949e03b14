"""``raysim ls [KIND] [NAME]``: the registered plugins and partitioners, with their options.

Without NAME, one table per kind: each entry with its options as ``name: type = default``, the
allowed values of a ``Literal`` in place of its type (``mode: eval|train = train``) and a nested
section as the names of its options (``local: {epochs, batch_size, ...}``). With NAME, one entry's
options flattened to the dotted keys a job file or an override uses (``local.lr``), each with its
type, default, allowed values and description (the field's ``description``, else its entry in the
Config's ``Attributes:`` docstring section, else the comment on its line).

Usage:
    raysim ls                      # everything
    raysim ls partitioners         # one kind
    raysim ls algorithms fedprox   # one entry, every option
    raysim ls fedprox              # the same: the name is looked up in every kind
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.table import Table
from rich.text import Text

from raysim.cli.option_docs import descriptions
from raysim.errors import RaysimError

KINDS = ("algorithms", "datasets", "models", "probes", "partitioners")
SECTION_NAMES = 4  # a nested section in the overview: its first option names, then "+N"


@dataclass(frozen=True)
class Option:
    """One row of the detail table: a dotted key and what it takes."""

    key: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass(frozen=True)
class Listed:
    """One thing ``raysim ls`` shows, a registered plugin or a partitioner, as plain values read
    from its Config: ``lines`` for the overview (``summary_lines``), ``options`` for the detail."""

    kind: str
    name: str
    summary: str
    lines: tuple[str, ...]
    options: tuple[Option, ...]

    @classmethod
    def of(cls, kind: str, name: str, config: type[BaseModel], summary: str) -> Listed:
        lines = summary_lines(config, skip_kind=kind == "partitioners")
        return cls(kind, name, summary, tuple(lines), tuple(flatten(config)))

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Listed:
        options = tuple(Option(**option) for option in plain["options"])
        return cls(plain["kind"], plain["name"], plain["summary"], tuple(plain["lines"]), options)


def add_parser(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser(
        "ls",
        help="list algorithms, datasets, models, probes and partitioners with their options",
        description="Without NAME: every entry of KIND (default: all kinds) with its options as "
        "`name: type = default`. With NAME: that entry's options as dotted keys, with type, "
        "default, allowed values and description.",
    )
    ls.add_argument("kind", nargs="?", metavar="KIND", help=f"one of {', '.join(KINDS)}; or a NAME")
    ls.add_argument("name", nargs="?", metavar="NAME", help="an entry of KIND: show every option")
    ls.set_defaults(handler=cmd_ls)


def cmd_ls(args: argparse.Namespace) -> int:
    from raysim.cli.console import console

    kind = _kind(args.kind) if args.kind else None
    if args.kind and kind is None and args.name is None:  # `raysim ls fedprox`
        for listed in find(args.kind, None):
            console.print(detail(listed))
        return 0
    if args.kind and kind is None:
        raise RaysimError(f"unknown kind {args.kind!r}; choose one of {', '.join(KINDS)}")
    if args.name:
        for listed in find(args.name, kind):
            console.print(detail(listed))
        return 0
    entries = catalog()
    for title in [kind] if kind else KINDS:
        console.print(overview(title, entries[title]))
    return 0


def _kind(word: str) -> str | None:
    """``algorithms`` or ``algorithm`` -> ``algorithms``; None for another word."""
    plural = word if word.endswith("s") else f"{word}s"
    return plural if plural in KINDS else None


def catalog() -> dict[str, list[Listed]]:
    """Every kind's entries; read from the cache while no source file changed, so that listing
    imports no plugin (and no torch) then (``raysim.cli.source_cache``)."""
    from raysim.cli.source_cache import cached

    plain = cached("ls", lambda: {kind: [asdict(e) for e in listing(kind)] for kind in KINDS})
    return {kind: [Listed.from_plain(entry) for entry in entries] for kind, entries in plain.items()}


def listing(kind: str) -> list[Listed]:
    """Every entry of ``kind`` (a plural of ``KINDS``), sorted by name, read from the Configs."""
    if kind == "partitioners":
        from raysim.data.partition import PartitionConfig

        members = get_args(get_args(PartitionConfig)[0])  # Annotated[Union[...], Field] -> members
        found = [Listed.of(kind, _tag(m), m, _first_paragraph(m.__doc__)) for m in members]
        return sorted(found, key=lambda listed: listed.name)
    from raysim import registry

    singular = typing.cast("registry.Kind", kind[:-1])
    return [Listed.of(kind, e.name, e.config, e.summary) for e in registry.entries(singular)]


def find(name: str, kind: str | None) -> list[Listed]:
    """The entries called ``name`` in ``kind`` (every kind when None).

    Raises:
        RaysimError: none, naming the closest names.
    """
    entries = catalog()
    kinds = [kind] if kind else list(KINDS)
    everything = [listed for k in kinds for listed in entries[k]]
    found = [listed for listed in everything if listed.name == name]
    if found:
        return found
    what = kind[:-1] if kind else "algorithm, dataset, model, probe or partitioner"
    elsewhere = [k for k in KINDS if k != kind and any(listed.name == name for listed in entries[k])]
    if elsewhere:
        raise RaysimError(f"no {what} is called {name!r}; see raysim ls {elsewhere[0]} {name}")
    close = difflib.get_close_matches(name, sorted({listed.name for listed in everything}), n=3)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise RaysimError(
        f"no {what} is called {name!r}{hint} (raysim ls{' ' + kind if kind else ''} lists them)"
    )


def overview(title: str, entries: list[Listed]) -> Table:
    """One row per entry: its name, its options (``name: type = default``), what it is."""
    table = Table(title=title, show_lines=True, expand=True)
    table.add_column("name", no_wrap=True)
    table.add_column("options (raysim ls KIND NAME: every detail)", ratio=3)
    table.add_column("what it is", ratio=2)
    for listed in entries:  # Text: "[int]" is no markup
        table.add_row(listed.name, Text("\n".join(listed.lines)), Text(listed.summary))
    return table


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


def detail(listed: Listed) -> Table:
    """Every option of one entry, nested sections flattened to dotted keys."""
    title = Text(f"{listed.name} ({listed.kind[:-1]}): {listed.summary}")
    table = Table(title=title, title_justify="left", expand=True)
    options = listed.options
    table.add_column("option", no_wrap=True, min_width=max((len(o.key) for o in options), default=6))
    for column, ratio in (("type", 3), ("default", 2), ("allowed", 3), ("description", 5)):
        table.add_column(column, ratio=ratio, overflow="fold")
    for option in options:
        table.add_row(
            *map(Text, (option.key, option.type, option.default, option.allowed, option.description))
        )
    if not options:
        table.add_row("(no options)", "", "", "", "")
    return table


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
                kinds = " | ".join(map(_tag, members))
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
            return " | ".join(["{" + "|".join(map(_tag, models)) + "}", *rest])
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


def _tag(model: type[BaseModel]) -> str:
    """A union member's ``kind`` (its Literal default), else its class name."""
    field = model.model_fields.get("kind")
    return str(field.default) if field is not None and isinstance(field.default, str) else model.__name__


def _member_signature(model: type[BaseModel]) -> str:
    """``dirichlet(num_clients, alpha, min_size, max_size)``: a kind and its options."""
    return f"{_tag(model)}({', '.join(n for n in model.model_fields if n != 'kind')})"


def _first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
