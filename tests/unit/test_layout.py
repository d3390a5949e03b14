"""The package's tiers (docs/architecture.md, section 1): each module imports raysim only from its
own tier or the tiers before it, and only six modules import Ray: the runtime's ray_backend.py
with ray_workers.py (the actor), ray_session.py (``ray.init``) and ray_placement.py (worker
counts), the sweep's ray_cells.py (a sweep's cells as Ray tasks) and the CLI's ray_jobs.py (the
Ray Jobs client of ``raysim submit``). Imports inside functions count too (a lazy import is still a
dependency).

The unit tests mirror the package: the tests of ``raysim/train/local.py`` live in
``tests/unit/train/``, those of ``raysim/params.py`` in ``tests/unit/test_params.py``.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

UNIT = Path(__file__).resolve().parent
RAYSIM = UNIT.parents[1] / "raysim"
PLUGIN_TESTS = {"algorithms", "recipes", "tools"}  # of algorithms/*.py, datasets/*.py (recipes), tools/*.py
WHOLE_REPO_TESTS = {"test_docs.py", "test_layout.py"}  # of the repository, not of one module
# the contract (raysim/*.py and config/), then the toolkit's rooms, then who runs what
TIERS = {
    "contract": 0,
    "config": 0,
    "train": 1,
    "measure": 2,
    "systems": 2,
    "selection": 2,
    "privacy": 2,
    "compress": 2,
    "robust": 2,
    "data": 3,
    "models": 3,
    "runtime": 4,
    "tracking": 5,
    "engine": 6,
    "results": 7,
    "sweep": 7,
    "bench": 7,
    "cli": 8,
}
FRONT_DOORS = {"__init__.py", "__main__.py"}  # re-export the public API / call the CLI


def tier(module: str) -> int:
    """``raysim.engine.loop`` -> 6; ``raysim.params`` (or ``raysim``) -> the contract's 0."""
    parts = module.split(".")
    return TIERS.get(parts[1], 0) if len(parts) > 1 else 0


def imports(path: Path) -> list[str]:
    """Every module a file imports, with ``from raysim import params`` as ``raysim.params``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [
                f"{node.module}.{alias.name}" if node.module == "raysim" else node.module
                for alias in node.names
            ]
    return out


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(RAYSIM.rglob("*.py")):
        rel = path.relative_to(RAYSIM)
        if len(rel.parts) == 1 and rel.name in FRONT_DOORS:
            continue
        found.append(("raysim." + ".".join(rel.with_suffix("").parts), path))
    return found


def test_every_module_imports_only_its_tier_or_earlier_ones():
    found = modules()
    assert len(found) > 40  # the scan sees the package
    wrong = [
        f"{name} (tier {tier(name)}) imports {target} (tier {tier(target)})"
        for name, path in found
        for target in imports(path)
        if target.split(".")[0] == "raysim" and tier(target) > tier(name)
    ]
    assert not wrong, "\n".join(wrong)


def test_only_the_six_ray_modules_import_ray():
    importers = sorted(
        name for name, path in modules() if any(t == "ray" or t.startswith("ray.") for t in imports(path))
    )
    assert importers == [
        "raysim.cli.ray_jobs",
        "raysim.runtime.ray_backend",
        "raysim.runtime.ray_placement",
        "raysim.runtime.ray_session",
        "raysim.runtime.ray_workers",
        "raysim.sweep.ray_cells",
    ]


def test_the_tiers_are_the_packages_that_exist():
    packages = {p.name for p in RAYSIM.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(TIERS) - {"contract"}
    assert tier("raysim.engine.loop") == 6 and tier("raysim.params") == 0 and tier("raysim") == 0


MAX_LINES = 400  # a module longer than this holds more than one concern: split it by concern
# ``make test`` checks the formatting (``ruff format --check``), so a count is the formatter's


def test_no_module_is_over_400_lines():
    root = RAYSIM.parent
    files = [path for name in ("raysim", "algorithms", "datasets") for path in (root / name).rglob("*.py")]
    assert len(files) > 60  # the scan sees all three folders
    lengths = {path.relative_to(root): path.read_bytes().count(b"\n") for path in files}  # as wc -l counts
    too_long = sorted(f"{path}: {n} lines" for path, n in lengths.items() if n > MAX_LINES)
    assert not too_long, "split these by concern:\n" + "\n".join(too_long)


def test_every_unit_test_folder_names_a_room_of_the_package_or_the_plugins():
    folders = sorted(
        path.relative_to(UNIT) for path in UNIT.rglob("*") if path.is_dir() and path.name != "__pycache__"
    )
    strays = [
        str(folder)
        for folder in folders
        if not (folder.parts[0] in PLUGIN_TESTS and len(folder.parts) == 1) and not (RAYSIM / folder).is_dir()
    ]
    assert not strays, f"tests/unit folders that name no raysim/ room: {strays}"
    rooms = {p.name for p in RAYSIM.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms | PLUGIN_TESTS <= {str(folder) for folder in folders}, "a room without its test folder"


def test_a_test_at_the_top_of_tests_unit_is_of_a_top_level_module():
    """``tests/unit/test_X.py`` tests ``raysim/X.py``; a room's tests go in its folder."""
    misplaced = [
        path.name
        for path in sorted(UNIT.glob("test_*.py"))
        if path.name not in WHOLE_REPO_TESTS and not (RAYSIM / path.name.removeprefix("test_")).is_file()
    ]
    assert not misplaced, f"tests/unit/test_X.py with no raysim/X.py (move them to their room): {misplaced}"


def test_no_two_modules_share_a_name():
    """A module's name says what it holds wherever it is imported from: no ``plots`` in two rooms."""
    names = [path.name for path in RAYSIM.rglob("*.py") if path.name != "__init__.py"]
    assert len(names) > 60
    twins = sorted({name for name in names if names.count(name) > 1})
    assert not twins, f"modules of the same name in different rooms: {twins}"


def test_a_rooms_test_file_is_named_for_a_module_of_that_room():
    """``tests/unit/results/test_tables.py`` tests ``raysim/results/tables.py``; an aspect may follow
    the module's name (``test_backend_sharding.py``)."""
    misnamed = []
    for path in sorted(UNIT.rglob("test_*.py")):
        room = path.parent.relative_to(UNIT)
        if path.parent == UNIT or room.parts[0] in PLUGIN_TESTS:
            continue
        modules = {module.stem for module in (RAYSIM / room).glob("*.py") if module.stem != "__init__"}
        name = path.stem.removeprefix("test_")
        if not any(name == module or name.startswith(module + "_") for module in modules):
            misnamed.append(str(path.relative_to(UNIT)))
    assert not misnamed, f"test files named for no module of their room: {misnamed}"


def test_no_plugin_casts_its_types():
    """Plugin state is typed (frozen dataclasses, generic ServerState/Payload/ClientContext): no
    ``typing.cast`` in ``algorithms/``, by call or by import. mypy checks algorithms/ with
    --strict's flags (pyproject.toml), but strict mypy accepts a cast that is not redundant, so
    this stays."""
    casts = []
    for path in sorted((RAYSIM.parent / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(alias.name == "cast" for alias in node.names):
                casts.append(f"{path.name}:{node.lineno} imports cast")
            elif isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == "cast")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "cast")
            ):
                casts.append(f"{path.name}:{node.lineno} calls cast")
    assert not casts, casts


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (no packages), so a second test_x.py anywhere
    under tests/ stops the whole collection ("import file mismatch")."""
    names = Counter(path.name for path in (RAYSIM.parent / "tests").rglob("test_*.py"))
    assert not [name for name, n in names.items() if n > 1]


def test_fmt_skip_only_keeps_a_table_of_literals_as_laid_out():
    """``# fmt: skip`` is for tables a reader scans in columns (a tuple of names, a dict of kinds,
    a palette), never for a call or a signature squeezed onto fewer lines."""
    root, misused = RAYSIM.parent, []
    for path in sorted(
        p for name in ("raysim", "algorithms", "datasets", "tools") for p in (root / name).rglob("*.py")
    ):
        lines = path.read_text().splitlines()
        skipped = {n for n, line in enumerate(lines, 1) if line.rstrip().endswith("# fmt: skip")}
        if not skipped:
            continue
        tables = {
            node.end_lineno
            for node in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and node.value is not None
            and _is_table(node.value)
        }
        misused += [f"{path.relative_to(root)}:{n}" for n in sorted(skipped - tables)]
    assert not misused, f"fmt: skip outside a table of literals (let the formatter lay it out): {misused}"


def _is_table(value: ast.expr) -> bool:
    """A tuple, list or dict of constants and names (``np.array(...)`` of one too), nothing computed."""
    if isinstance(value, ast.Call):  # np.array([[...]], dtype=...)
        array = isinstance(value.func, ast.Attribute) and value.func.attr == "array"
        return array and bool(value.args) and all(_is_table(arg) for arg in value.args)
    if not isinstance(value, (ast.Tuple, ast.List, ast.Dict)):
        return False
    leaves = (
        ast.Constant,
        ast.Name,
        ast.Attribute,
        ast.UnaryOp,
        ast.USub,
        ast.Load,
        ast.Tuple,
        ast.List,
        ast.Dict,
    )
    return all(isinstance(node, (*leaves, ast.expr_context, ast.unaryop)) for node in ast.walk(value))
