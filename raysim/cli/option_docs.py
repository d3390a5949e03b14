"""Where ``raysim ls`` finds an option's description: the field's ``description``, else its entry
in the ``Attributes:`` section of its Config's docstring, else the comment on its line."""

from __future__ import annotations

import inspect
import re

from pydantic import BaseModel


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
