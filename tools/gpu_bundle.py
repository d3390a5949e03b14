"""Builds .gpu/site-cpXY.tar.xz: the Python packages raysim needs that the GPU machines lack.

The GPU machines (Python 3.12, CUDA torch) have no Ray, no pydantic and no package registry, and
at most 64 MiB of files travel with the repository. This script, run where PyPI is reachable,
downloads the pinned wheels for the target Python, installs them into a folder, drops the parts of
Ray that a local run never loads (Java jars, RLlib, Serve, LLM, Tune, Train, Data, the
dashboard's web client: 193 MiB -> 138 MiB) and packs the folder with xz (about 28 MiB).
``tools/gpu_check.py`` unpacks it on the GPU machine and puts it on PYTHONPATH.

Usage (``make gpu-bundle``):
    python3 tools/gpu_bundle.py                  # .gpu/site-cp312.tar.xz, for the GPU machines
    python3 tools/gpu_bundle.py --python 3.11 --level 1   # a quick one for a dry run here
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Ray as pyproject.toml pins it; pydantic as the dev venv resolves it; jsonschema and its needs
# because Ray lists it (runtime-env validation). Everything else Ray and raysim import is there.
PINS = [
    "ray==2.60.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
# Parts of the Ray wheel a local ray.init with actors never imports.
RAY_UNUSED = ["jars", "rllib", "serve", "llm", "tune", "train", "data", "dashboard/client"]


def bundle_path(python: str) -> Path:
    return REPO / ".gpu" / f"site-cp{python.replace('.', '')}.tar.xz"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def target_flags(python: str) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    return flags + [f for p in PLATFORMS for f in ("--platform", p)]


def build(python: str, level: int) -> Path:
    work = REPO / "build" / f"gpu-cp{python.replace('.', '')}"
    wheels, site = work / "wheels", work / "site"
    pip("download", "-q", "--no-deps", "-d", str(wheels), *target_flags(python), *PINS)
    shutil.rmtree(site, ignore_errors=True)
    names = [str(w) for w in sorted(wheels.glob("*.whl")) if any(_is_pinned(w.name, p) for p in PINS)]
    pip(
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        "--no-compile",
        "--target",
        str(site),
        *target_flags(python),
        *names,
    )
    for part in RAY_UNUSED:
        shutil.rmtree(site / "ray" / part)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts name this machine's python
    out = bundle_path(python)
    out.parent.mkdir(exist_ok=True)
    with lzma.open(out, "wb", preset=level) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
        for entry in sorted(site.iterdir()):
            tar.add(entry, arcname=entry.name)
    return out


def _is_pinned(wheel: str, pin: str) -> bool:
    """``ray-2.60.0-cp312-...whl`` is ``ray==2.60.0``: wheel names spell '-' as '_'."""
    name, version = pin.split("==")
    return wheel.lower().startswith(f"{name.replace('-', '_')}-{version}-")


def tracked_bytes() -> int:
    """The repository as it travels: its tracked files."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [REPO / p for p in files.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--level", type=int, default=6, help="xz preset, 0-9 (default 6)")
    args = parser.parse_args()
    out = build(args.python, args.level)
    mib = 2**20
    repo, carried = tracked_bytes(), out.stat().st_size
    print(
        f"{out.relative_to(REPO)}: {carried / mib:.1f} MiB; with the repository's tracked files "
        f"({repo / mib:.1f} MiB) {(repo + carried) / mib:.1f} MiB travel (the limit is 64 MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
