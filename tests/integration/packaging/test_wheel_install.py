"""A wheel install (not only an editable one) carries and finds the built-in plugins.

The plugins live beside the package in the repository (``algorithms/``, ``datasets/``);
pyproject.toml maps them into the wheel as ``raysim/_builtin/``. The wheel is installed into a
folder of its own, put first on ``PYTHONPATH`` of a fresh interpreter started outside the
repository, so ``import raysim`` resolves to the installed copy, not the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "raysim").rglob("__init__.py")}
    assert on_disk <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {on_disk - listed}"


def test_an_installed_wheel_finds_the_builtin_plugins(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, REPO], check=True)
    (wheel,) = wheels.glob("raysim-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    probe = (
        "import raysim, raysim.registry as r; r.load_builtins(); "
        "print(raysim.__file__); print(' '.join(r.names('algorithm'))); print(' '.join(r.names('dataset')))"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "RAYSIM_PLUGIN_PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert Path(out[0]).is_relative_to(site)  # the installed copy, not the checkout
    assert {"fedavg", "fedprox", "scaffold", "fedgucci"} <= set(out[1].split())
    assert {"mnist", "digits", "c4"} <= set(out[2].split())
