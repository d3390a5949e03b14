"""``import raysim``, ``raysim --help`` and a cached ``raysim ls`` import no heavy library: each
command imports what it needs when it runs (timings: ``raysim bench``, docs/performance.md)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from raysim.cli import ls

HEAVY = ("torch", "ray", "mlflow", "transformers", "datasets", "pyarrow", "numpy")


def heavy_imports(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    report = f"import sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}"], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_import_raysim_imports_no_heavy_library_until_a_name_is_used():
    assert heavy_imports("import raysim") == []
    assert "torch" in heavy_imports("import raysim; raysim.train_local")  # on first use


def test_every_public_name_comes_from_the_module_named_for_it():
    import raysim

    assert sorted(raysim.__all__) == sorted(raysim._HOME)  # the lazy table and __all__ agree
    for name in raysim.__all__:
        assert getattr(raysim, name) is getattr(importlib.import_module(raysim._HOME[name]), name)
    with pytest.raises(AttributeError, match="no attribute 'runn'"):
        raysim.runn  # noqa: B018


def test_the_cli_and_its_help_import_no_heavy_library():
    help_only = (
        "import contextlib, io\nfrom raysim.cli.main import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])"
    )
    assert heavy_imports(help_only) == []


def test_ls_from_its_cache_imports_no_plugin_nor_torch():
    ls.catalog()  # fills the cache (RAYSIM_CACHE, the tests' own) for the source as it is
    listing = (
        "import contextlib, io\nfrom raysim.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main(['ls', 'fedprox']) == 0\n"
        "assert 'local.batch_size' in out.getvalue()"
    )
    assert heavy_imports(listing) == []
