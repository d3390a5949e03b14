"""What the recipe tests share: a recipe file loaded as the registry loads it, and a registry that
knows only the recipes a test loaded."""

import sys
from collections.abc import Callable
from types import ModuleType

import pytest

from raysim import registry


def _load(stem: str) -> ModuleType:
    """datasets/<stem>.py, executed the way the registry does, without scanning every plugin."""
    registry.load_plugin_file(registry.REPO_ROOT / "datasets" / f"{stem}.py", "datasets")
    return sys.modules[f"raysim_plugins.datasets.{stem}"]


@pytest.fixture
def recipe() -> Callable[[str], ModuleType]:
    """``recipe("mnist")``: the recipe's module."""
    return _load


@pytest.fixture
def only_loaded_recipes(monkeypatch):
    # open_dataset looks recipes up by name; skip the scan of models and algorithms.
    monkeypatch.setattr(registry, "load_builtins", lambda: None)
