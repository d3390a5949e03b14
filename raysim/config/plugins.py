"""Sections that name a plugin (``name:`` plus the plugin's own options), what a job reads from a
plugin class or its Config (``raysim.algorithm``'s table: ``MIXED_MODELS``, ``DEFAULT_MODEL``,
``check_job``, ``sample_privacy_problem``, ``UPDATE_DELTA``), and pydantic's errors worded for a
job file's author: the key, what is wrong, the valid keys or the nearest name."""

from __future__ import annotations

import copy
import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from raysim import registry
from raysim.errors import ConfigError
from raysim.registry import plugin_config

_WORDED = "raysim_worded"  # the pydantic error type of a message worded already (nested_plugin)


def accepts_mixed_models(plugin_class: object) -> bool:
    """``MIXED_MODELS``: whether per-client architectures (``model_groups``) may reach the plugin."""
    return getattr(plugin_class, "MIXED_MODELS", False) is True


def default_model(plugin_class: object) -> dict[str, Any] | None:
    """A copy of ``DEFAULT_MODEL``, the model a job that names none trains (DENSE's BatchNorm)."""
    default = getattr(plugin_class, "DEFAULT_MODEL", None)
    return None if default is None else copy.deepcopy(dict(default))


def job_problems(config: BaseModel, job: BaseModel) -> list[str]:
    """``config.check_job(job)`` (``job`` a ``JobCore``): IMA's ``average_from`` against
    ``engine.num_rounds``, say; none where the Config has no such check."""
    check = getattr(config, "check_job", None)
    return list(check(job)) if callable(check) else []


def update_delta(plugin_class: object, config: BaseModel) -> str | None:
    """``UPDATE_DELTA`` (or the Config's ``update_delta()``, for a wrapper such as IMA): where the
    plugin's update holds its parameter delta, which ``compression`` encodes: "" the update itself
    (a dict keyed like the params), else the name of the update's field; None: it holds none."""
    hook = getattr(config, "update_delta", None)
    where = hook() if callable(hook) else getattr(plugin_class, "UPDATE_DELTA", None)
    return where if isinstance(where, str) else None


def sample_privacy_problem(config: BaseModel) -> str | None:
    """``config.sample_privacy_problem()``: why the configured plugin cannot honour DP-SGD
    (``privacy.sample``; FedFish's depends on its ``fisher_source``); None where it can, or where
    the Config has no such hook: a plugin that trains through ``train_client`` on the task loss."""
    hook = getattr(config, "sample_privacy_problem", None)
    problem = hook() if callable(hook) else None
    return problem if isinstance(problem, str) else None


class PluginSection(BaseModel):
    """A registered plugin's name and its validated options."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str
    config: SerializeAsAny[BaseModel]

    def to_dict(self) -> dict[str, Any]:
        """The section as a job file writes it: ``{name: ..., **options}``."""
        return {"name": self.name, **self.config.model_dump(mode="json")}


def validate_probes(raw: Any, problems: list[str]) -> list[PluginSection | None]:
    if not isinstance(raw, list):
        problems.append("evaluation.probes: must be a list of {name: <probe>, ...options}")
        return []
    return [validate_plugin("probe", item, problems, f"evaluation.probes[{i}]") for i, item in enumerate(raw)]


def validate_plugin(
    kind: registry.Kind, raw: Any, problems: list[str], where: str | None = None
) -> PluginSection | None:
    where = where or kind
    available = ", ".join(registry.names(kind))
    if raw is None:
        problems.append(f"{where}: required section missing (a mapping with name: one of {available})")
        return None
    if not isinstance(raw, dict) or "name" not in raw:
        problems.append(f"{where}.name: required (one of {available})")
        return None
    options = {k: v for k, v in raw.items() if k != "name"}
    try:
        entry = registry.get(kind, str(raw["name"]))
        return PluginSection(name=entry.name, config=plugin_config(entry.config, options))
    except ConfigError as exc:  # an unknown name: say where it was
        problems += [problem.replace(f"{kind}.name", f"{where}.name", 1) for problem in exc.problems]
    except ValidationError as exc:
        entry = registry.get(kind, str(raw["name"]))
        problems += explain(exc, entry.config, prefix=f"{where}.")
    return None


def explain(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per pydantic error: dotted key, what is wrong, what is allowed or meant."""
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        if err["type"] == "extra_forbidden" and (tagged := _not_of_kind(model, loc, prefix)) is not None:
            lines.append(tagged)
            continue
        key = (prefix + ".".join(loc)).rstrip(".") or "job"
        lines.append(f"{key}: {_wording(err, loc, model)}")
    return lines


def _not_of_kind(model: type[BaseModel], loc: list[str], prefix: str) -> str | None:
    """An unknown key of a tagged union's member (``dataset.partition.iid.alpha``: pydantic puts
    the kind in the key) worded without it, naming the fix: ``kind=iid`` as an override keeps the
    file's keys of the kind it replaces."""
    if len(loc) < 3 or loc[-2] not in _tags_at(model, loc[:-2], "kind"):
        return None
    section, kind, key = prefix + ".".join(loc[:-2]), loc[-2], loc[-1]
    member = [m for m in _models_at(model, loc[:-2]) if kind in _tags_at(m, [], "kind")]
    valid = sorted(member[0].model_fields) if member else []
    return (
        f"{section}.{key}: not a key of kind {kind!r} (its keys: {', '.join(valid)}); "
        f"remove it, or to switch kind set the whole section: {section}='{{kind: {kind}}}'"
    )


def _wording(err: ErrorDetails, loc: list[str], model: type[BaseModel]) -> str:
    """What is wrong at ``loc``, and what is allowed or meant."""
    if err["type"] == _WORDED:  # a nested plugin section's error, worded against its own Config
        return err["msg"]
    if err["type"] == "extra_forbidden":
        valid = _fields_at(model, loc[:-1])
        close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown key{hint} (valid keys: {', '.join(sorted(valid))})"
    if err["type"] == "missing":
        return "required"
    if err["type"] == "union_tag_not_found":  # a tagged union's section without its tag
        tag = str(err.get("ctx", {}).get("discriminator", "kind")).strip("'")
        tags = _tags_at(model, loc, tag)
        return f"needs {tag}: one of {', '.join(tags)}" if tags else f"needs {tag}"
    message = err["msg"].removeprefix("Value error, ")
    if not loc or isinstance(err.get("input"), dict | list):  # a section's check: its message says it
        return message
    return f"{message} (got {err.get('input')!r})"


def nested_plugin(kind: registry.Kind, raw: Any) -> PluginSection:
    """A plugin section inside another plugin's options (IMA's ``inner``), validated like a job's.

    ``raw`` is ``{name: ..., **options}`` (what ``PluginSection.to_dict`` writes) or a section.
    Use it in a ``mode="before"`` validator of a ``PluginSection`` field, serialized with
    ``to_dict``: its errors then carry keys inside the field (``algorithm.inner.local.lr``),
    worded against the nested plugin's own Config.

    Raises:
        ValueError: ``raw`` is not a mapping with a name.
        ValidationError: the name is unknown, or the options are invalid for the named plugin.
    """
    if isinstance(raw, PluginSection):
        return raw
    if not isinstance(raw, dict) or "name" not in raw:
        raise ValueError(f"must be a mapping with name: one of {', '.join(registry.names(kind))}")
    try:
        entry = registry.get(kind, str(raw["name"]))
    except ConfigError as exc:  # "<kind>.name: unknown ...; did you mean ...?"
        unknown = _worded(("name",), exc.problems[0].split(": ", 1)[-1], raw["name"])
        raise ValidationError.from_exception_data(kind, [unknown]) from None
    try:
        config = plugin_config(entry.config, {k: v for k, v in raw.items() if k != "name"})
    except ValidationError as exc:
        errors = [
            _worded(
                err["loc"], _wording(err, [str(part) for part in err["loc"]], entry.config), err.get("input")
            )
            for err in exc.errors()
        ]
        raise ValidationError.from_exception_data(exc.title, errors) from None
    return PluginSection(name=entry.name, config=config)


def _worded(loc: tuple[int | str, ...], text: str, value: Any) -> InitErrorDetails:
    """A pydantic error at ``loc`` whose message ``explain`` prints as it is."""
    return InitErrorDetails(type=PydanticCustomError(_WORDED, "{text}", {"text": text}), loc=loc, input=value)


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names of the (nested) model at ``loc``; unions contribute all their members."""
    return sorted({name for m in _models_at(model, loc) for name in m.model_fields})


def _tags_at(model: type[BaseModel], loc: list[str], tag: str) -> list[str]:
    """The values of the tag field ``tag`` that the tagged union at ``loc`` accepts, in order."""
    values = [
        str(value)
        for m in _models_at(model, loc)
        if tag in m.model_fields
        for value in typing.get_args(m.model_fields[tag].annotation)
    ]
    return list(dict.fromkeys(values))


def _models_at(model: type[BaseModel], loc: list[str]) -> list[type[BaseModel]]:
    """The (nested) models at ``loc``: all the members of a union."""
    models = [model]
    for part in loc:
        nested = []
        for m in models:
            if part in m.model_fields:
                nested += _models_in(m.model_fields[part].annotation)
        models = nested or models  # a union tag or list index: stay on the same models
    return models


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated, list, dict):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def section_config(kind: registry.Kind, section: dict[str, Any], where: str) -> BaseModel:
    """A plugin section outside a job's own plugin sections (a transfer dataset, ``map_clients``'
    ``model``) validated: its name is registered and its options fit the plugin's Config.

    Raises:
        ConfigError: worded with ``where`` as the keys' prefix (``map_clients model.hidden: ...``).
    """
    entry = registry.get(kind, str(section.get("name", "")))
    try:
        return plugin_config(entry.config, {k: v for k, v in section.items() if k != "name"})
    except ValidationError as exc:
        raise ConfigError(explain(exc, entry.config, where)) from None
