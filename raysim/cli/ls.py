"""``raysim ls [KIND] [NAME]``: the registered plugins and partitioners, with their options.

Without NAME, one table per kind: each entry with its options as ``name: type = default``, the
allowed values of a ``Literal`` in place of its type (``mode: eval|train = train``) and a nested
section as the names of its options (``local: {epochs, batch_size, ...}``). With NAME, one entry's
options flattened to the dotted keys a job file or an override uses (``local.lr``), each with its
type, default, allowed values and description (the field's ``description``, else its entry in the
Config's ``Attributes:`` docstring section, else the comment on its line; ``raysim.cli.options``
reads them, and ``raysim.cli.source_cache`` keeps the listing until a source file changes).

Usage:
    raysim ls                      # everything
    raysim ls partitioners         # one kind
    raysim ls algorithms fedprox   # one entry, every option
    raysim ls fedprox              # the same: the name is looked up in every kind
"""

from __future__ import annotations

import argparse
import difflib
import typing
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, get_args

from raysim.errors import RaysimError

if TYPE_CHECKING:  # the listing comes from its cache (source_cache): pydantic and rich as needed
    from pydantic import BaseModel
    from rich.table import Table

    from raysim.cli.options import Option

KINDS = ("algorithms", "datasets", "models", "probes", "partitioners")


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
        from raysim.cli.options import flatten, summary_lines

        lines = summary_lines(config, skip_kind=kind == "partitioners")
        return cls(kind, name, summary, tuple(lines), tuple(flatten(config)))

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Listed:
        from raysim.cli.options import Option

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
    from raysim.cli.console import console, reading_width

    kind = _kind(args.kind) if args.kind else None
    if args.kind and kind is None and args.name is None:  # `raysim ls fedprox`
        for listed in find(args.kind, None):
            console.print(detail(listed), width=reading_width(console))
        return 0
    if args.kind and kind is None:
        raise RaysimError(f"unknown kind {args.kind!r}; choose one of {', '.join(KINDS)}")
    if args.name:
        for listed in find(args.name, kind):
            console.print(detail(listed), width=reading_width(console))
        return 0
    entries = catalog()
    for title in [kind] if kind else KINDS:
        console.print(overview(title, entries[title]), width=reading_width(console))
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
        from raysim.cli.options import first_paragraph, kind_of
        from raysim.data.partition import PartitionConfig

        members = get_args(get_args(PartitionConfig)[0])  # Annotated[Union[...], Field] -> members
        found = [Listed.of(kind, kind_of(m), m, first_paragraph(m.__doc__)) for m in members]
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
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=True, expand=True)
    table.add_column("name", no_wrap=True)
    table.add_column("options (raysim ls KIND NAME: every detail)", ratio=3)
    table.add_column("what it is", ratio=2)
    for listed in entries:  # Text: "[int]" is no markup
        table.add_row(listed.name, Text("\n".join(listed.lines)), Text(listed.summary))
    return table


def detail(listed: Listed) -> Table:
    """Every option of one entry, nested sections flattened to dotted keys."""
    from rich.table import Table
    from rich.text import Text

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
