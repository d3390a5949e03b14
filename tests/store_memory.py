"""What opening a client store costs the driver in memory, for a given number of clients.

Builds (once, under DIR) a store of N clients with one tiny example each (``write_store``, the
layout every recipe gets), then, in a fresh Python process that has already imported raysim,
opens it with ``ClientStore.open`` and reports the peak resident memory (``VmHWM``) above
the resident memory just before, and what stays resident while the store is open.

Usage:
    PYTHONPATH=. python tests/store_memory.py 1000000 10000000 [--dir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MEASURE = """
import json, sys
import psutil
from raysim.data.store import ClientStore

proc = psutil.Process()
before = proc.memory_info().rss
store = ClientStore.open(sys.argv[1])
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of this script, which
# has just built a store, would start at the builder's size (+383 MB read that way, 10M clients)
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024  # kB
held = proc.memory_info().rss
assert store.num_clients == int(sys.argv[2])
print(json.dumps({"peak_mb": (peak - before) / 2**20, "held_mb": (held - before) / 2**20}))
"""


def build(path: Path, num_clients: int) -> Path:
    """A store of ``num_clients`` clients holding one 1-byte example (label 0 or 1) each."""
    import numpy as np

    from raysim.data.format import is_complete
    from raysim.data.partition import Partition
    from raysim.data.prepare import write_store
    from raysim.data.store import Examples, image_table
    from raysim.types import DataSpec

    if is_complete(path):
        return path
    images = np.zeros((num_clients, 1, 1, 1), np.uint8)
    labels = np.arange(num_clients) % 2
    examples = Examples(image_table(images, labels), DataSpec("classification", (1, 1, 1), 2))
    partition = Partition(np.arange(num_clients), np.ones(num_clients, np.int64))
    return write_store(examples, partition, test_fraction=0.0, seed=0, path=path)


def measure(path: Path, num_clients: int) -> dict[str, float]:
    command = [sys.executable, "-c", _MEASURE, str(path), str(num_clients)]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("num_clients", type=int, nargs="+")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "raysim-store-memory")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per size; the median shows")
    args = parser.parse_args()
    for n in args.num_clients:
        t0 = time.perf_counter()
        path = build(args.dir / f"clients-{n}", n)
        built = time.perf_counter() - t0
        runs = sorted((measure(path, n) for _ in range(args.repeat)), key=lambda r: r["peak_mb"])
        mid = runs[len(runs) // 2]
        print(
            f"{n:>12,} clients: peak +{mid['peak_mb']:.0f} MB, held +{mid['held_mb']:.0f} MB while open "
            f"(median of {args.repeat}; store ready in {built:.0f} s)"
        )


if __name__ == "__main__":
    main()
