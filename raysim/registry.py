"""Finds algorithms, dataset recipes, models and probes by name.

Models live in ``raysim.models`` (an ordinary package), probes in ``raysim.measure.barrier`` and
``raysim.measure.connectivity`` (``PROBE_MODULES``). Algorithm
plugins and dataset recipes are files in the repo's ``algorithms/`` and ``datasets/`` folders,
which must never become importable packages (a ``datasets`` package would shadow HuggingFace
``datasets``). They are loaded by path under the private module names
``raysim_plugins.<folder>.<stem>``, from the repo root and from any folder listed in
``RAYSIM_PLUGIN_PATH`` (``os.pathsep``-separated roots holding those folders).

Usage:
    @register("algorithm", "fedavg")
    class FedAvg: ...
    entry = get("algorithm", "fedavg"); algo = entry.factory(entry.config(**options))
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from pydantic import BaseModel

from raysim.errors import ConfigError, RaysimError

if TYPE_CHECKING:
    from raysim.algorithm import Algorithm, StagedAlgorithm
    from raysim.probe import Probe

Kind = Literal["algorithm", "dataset", "model", "probe"]
KINDS: tuple[Kind, ...] = ("algorithm", "dataset", "model", "probe")
_PLUGIN_FOLDERS = {"algorithm": "algorithms", "dataset": "datasets"}
PROBE_MODULES = ("raysim.measure.barrier", "raysim.measure.connectivity")  # the built-in probes' modules
REPO_ROOT = Path(__file__).resolve().parent.parent
_SELF_REGISTERING = ("raysim.", "raysim_plugins.")  # modules every process loads by itself
# What register accepts: a type checker holds plugins and probes to their protocols here (any
# aggregate type: each plugin has its own; an algorithm of either shape).
AlgorithmFactory = TypeVar("AlgorithmFactory", bound="Callable[[Any], Algorithm[Any] | StagedAlgorithm]")
ProbeFactory = TypeVar("ProbeFactory", bound="Callable[[Any], Probe]")
Factory = TypeVar("Factory", bound=Callable[..., object])


@dataclass(frozen=True)
class Entry:
    """One registered plugin: how to build it and the pydantic model of its options."""

    kind: Kind
    name: str
    factory: Callable[..., Any]
    config: type[BaseModel]
    summary: str


_entries: dict[Kind, dict[str, Entry]] = {kind: {} for kind in KINDS}
_config_bases: dict[Kind, type[BaseModel]] = {}  # a kind whose every Config must subclass a base
_loaded = False


@overload
def register(
    kind: Literal["algorithm"], name: str, *, config: type[BaseModel] | None = None
) -> Callable[[AlgorithmFactory], AlgorithmFactory]: ...


@overload
def register(
    kind: Literal["probe"], name: str, *, config: type[BaseModel] | None = None
) -> Callable[[ProbeFactory], ProbeFactory]: ...


@overload
def register(
    kind: Literal["dataset", "model"], name: str, *, config: type[BaseModel] | None = None
) -> Callable[[Factory], Factory]: ...


def register(kind: Kind, name: str, *, config: type[BaseModel] | None = None) -> Callable[[Factory], Factory]:
    """Registers a class or function under ``(kind, name)``.

    ``config`` defaults to the factory's ``Config`` attribute. The same factory may be registered
    under several names with different configs (FedAdam and FedYogi are FedOpt with other defaults).
    """

    def decorate(factory: Factory) -> Factory:
        options = config if config is not None else getattr(factory, "Config", None)
        if options is None:
            raise TypeError(f"{kind} {name!r} needs a Config (pydantic model) to be registered")
        if "name" in options.model_fields:  # a job's `name:` picks the plugin: unsettable
            raise TypeError(f"{kind} {name!r}: its Config may not have a field called 'name'")
        base = _config_bases.get(kind)
        if base is not None and not issubclass(options, base):  # e.g. every model takes init_from
            raise TypeError(f"{kind} {name!r}: its Config must subclass {base.__module__}.{base.__name__}")
        # a name registered with its own config is described by that config's docstring
        doc = ((options.__doc__ if config is not None else factory.__doc__) or "").strip()
        module_doc = (sys.modules.get(factory.__module__).__doc__ or "").strip()
        summary = (doc or module_doc).splitlines()[0] if (doc or module_doc) else ""
        _entries[kind][name] = Entry(kind, name, factory, options, summary)
        return factory

    return decorate


def require_config_base(kind: Kind, base: type[BaseModel]) -> None:
    """Every Config registered for ``kind`` from now on must subclass ``base`` (the models'
    ``ModelConfig``, which gives every model section ``init_from``)."""
    _config_bases[kind] = base


def get(kind: Kind, name: str) -> Entry:
    """Returns the entry for ``name``; an unknown name raises ConfigError listing the choices."""
    load_builtins()
    try:
        return _entries[kind][name]
    except KeyError:
        choices = names(kind)
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            [f"{kind}.name: unknown {kind} {name!r}{hint} (available: {', '.join(choices)})"]
        ) from None


def names(kind: Kind) -> list[str]:
    """Sorted names registered for ``kind``."""
    load_builtins()
    return sorted(_entries[kind])


def entries(kind: Kind) -> list[Entry]:
    """Registered entries of ``kind``, sorted by name."""
    return [get(kind, name) for name in names(kind)]


def travelling_entries(named: Iterable[tuple[Kind, str]]) -> tuple[Entry, ...]:
    """The entries of ``named`` (a job's plugins) that a worker would not register by itself:
    those whose factory is neither raysim's nor a plugin file's (``raysim_plugins``), such as a
    class defined in a notebook (``__main__``). A worker ``adopt``s them; Ray ships a ``__main__``
    class by value (cloudpickle), another module's by name, which the worker imports. Only the
    job's own travel: another registered class the workers cannot import must not stop them."""
    found = (_entries[kind].get(name) for kind, name in dict.fromkeys(named))
    return tuple(e for e in found if e is not None and not e.factory.__module__.startswith(_SELF_REGISTERING))


def adopt(entries: tuple[Entry, ...]) -> None:
    """Registers the driver's ``travelling_entries`` in this process, over the built-ins."""
    load_builtins()
    for entry in entries:
        _entries[entry.kind][entry.name] = entry


def plugin_roots() -> list[Path]:
    """Folders searched for ``algorithms/`` and ``datasets/``: RAYSIM_PLUGIN_PATH, then the
    built-in ones."""
    extra = [Path(p) for p in os.environ.get("RAYSIM_PLUGIN_PATH", "").split(os.pathsep) if p]
    return [*extra, builtin_root()]


def builtin_root() -> Path:
    """Where the built-in plugin folders are: beside the package in a checkout (an editable
    install), inside it as ``raysim/_builtin`` in an installed wheel (pyproject.toml maps them)."""
    return REPO_ROOT if (REPO_ROOT / "algorithms").is_dir() else Path(__file__).resolve().parent / "_builtin"


def load_builtins() -> None:
    """Imports the model zoo and the probes, and loads every plugin file once per process."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    importlib.import_module("raysim.models")
    for module in PROBE_MODULES:
        importlib.import_module(module)
    for root in plugin_roots():
        for folder in _PLUGIN_FOLDERS.values():
            for path in sorted((root / folder).glob("*.py")):
                if not path.name.startswith("_"):
                    load_plugin_file(path, folder)


def load_plugin_file(path: Path, folder: str) -> None:
    """Executes one plugin file under the module name ``raysim_plugins.<folder>.<stem>``."""
    module_name = f"raysim_plugins.{folder}.{path.stem}"
    if module_name in sys.modules:
        return
    _ensure_namespace("raysim_plugins", f"raysim_plugins.{folder}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RaysimError(f"cannot load plugin file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # registered first so dataclasses and pickling can find it
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[module_name]
        raise


def _ensure_namespace(*names: str) -> None:
    """Empty parent modules, so ``raysim_plugins.<folder>.<stem>`` imports by name: pickle needs
    that for a plugin's own classes (an aggregator's partial) crossing between Ray processes."""
    for name in names:
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []  # a package with nothing on disk: submodules come from sys.modules
            sys.modules[name] = module


def plugin_config(config_type: type[BaseModel], options: dict[str, Any]) -> BaseModel:
    """Validates a plugin's options, a partial nested section keeping the plugin's own defaults.

    FedAdam's ``server:`` defaults to Adam at lr 0.01; ``server: {lr: 0.03}`` must mean "that
    Adam, at lr 0.03", not a generic ``ServerOptimizerConfig`` (SGD) at lr 0.03. So every nested
    section the user sets is merged over the Config's default for it, at any depth.

    Raises:
        ValidationError: the merged options are invalid (``explain`` words it).
    """
    defaults = {
        name: field.get_default(call_default_factory=True)
        for name, field in config_type.model_fields.items()
        if not field.is_required()
    }
    return config_type.model_validate(_merge_over_defaults(config_type, defaults, options))


def _merge_over_defaults(
    config_type: type[BaseModel], defaults: dict[str, Any], options: dict[str, Any]
) -> dict[str, Any]:
    """``options`` with each nested section given as a mapping completed from ``defaults``."""
    merged = dict(options)
    for key, value in options.items():
        default, field = defaults.get(key), config_type.model_fields.get(key)
        if isinstance(default, BaseModel) and isinstance(value, dict) and _same_member(field, default, value):
            inner = _merge_over_defaults(type(default), dict(default), value)
            merged[key] = {**default.model_dump(), **inner}
    return merged


def _same_member(field: Any, default: BaseModel, value: dict[str, Any]) -> bool:
    """False when ``value`` picks another member of a tagged union (a partition of another
    ``kind``): its options then start from that member's own defaults."""
    tag = getattr(field, "discriminator", None)
    if not isinstance(tag, str) and "kind" in type(default).model_fields:
        tag = "kind"  # e.g. server: {kind: sgd} over FedFish's Adam: SGD's own defaults, not Adam's
    return not isinstance(tag, str) or value.get(tag, getattr(default, tag)) == getattr(default, tag)
