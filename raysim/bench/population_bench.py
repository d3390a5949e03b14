"""``raysim bench`` of a population file: the driver's memory and sampling time as clients grow.

A benchmark file with ``bench.populations`` (``jobs/bench/population.yaml``) is a tiny job (one
1x1x1 image a client, an MLP) run once per population size, with ``dataset.num_examples`` and
``dataset.partition.num_clients`` set to that size. Each size is prepared in a fresh process, into
a fresh cache folder, then run in another, so that each process's peak resident memory
(``peak_rss_mb``) is that step's alone: what ``raysim prepare`` and the driver of ``raysim run``
would need. Sampling is timed apart from the round it starts (``Engine.cohort``).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

_CHILD = "from raysim.bench.population_bench import child; child()"


def run_population_benchmark(
    path: str | Path, overrides: list[str], populations: list[int], console: Console
) -> list[dict[str, Any]]:
    """Prepares and runs the job at each population size, each step in a process of its own."""
    rows = []
    for num_clients in populations:
        with tempfile.TemporaryDirectory(prefix="raysim-population-") as scratch:
            sized = [
                *overrides,
                f"dataset.num_examples={num_clients}",
                f"dataset.partition.num_clients={num_clients}",
                f"dataset.cache_dir={Path(scratch) / 'cache'}",
            ]
            prepared = _measure("prepare", path, sized, scratch)
            ran = _measure("run", path, sized, scratch)
        rows.append({"num_clients": num_clients, "prepare": prepared, "run": ran})
        console.print(
            f"{num_clients:,} clients: prepare {prepared['peak_mb']:.0f} MB, run {ran['peak_mb']:.0f} MB"
        )
    console.print(_table(rows))
    out = Path(".raysim") / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{Path(path).stem}.json").write_text(json.dumps(rows, indent=2))
    console.print(f"figures written to {out / f'{Path(path).stem}.json'}")
    return rows


def _measure(step: str, path: str | Path, overrides: list[str], scratch: str) -> dict[str, Any]:
    command = [sys.executable, "-c", _CHILD, step, str(path), scratch, *overrides]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"population benchmark, {step} step failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child() -> None:
    """In the measuring process: ``STEP PATH SCRATCH OVERRIDES...``; prints one JSON line."""
    step, path, scratch, *overrides = sys.argv[1:]
    from raysim.bench.bench_file import load_benchmark

    job, _ = load_benchmark(path, overrides)
    t0 = time.perf_counter()
    figures: dict[str, Any] = {}
    if step == "prepare":
        from raysim.data.prepare import prepare_store

        prepare_store(job.dataset.name, job.dataset.config)
    else:
        figures = _run_rounds(job, Path(scratch) / "runs")
    print(json.dumps({"peak_mb": peak_rss_mb(), "seconds": time.perf_counter() - t0, **figures}))


def peak_rss_mb() -> float:
    """This process's peak resident memory: Linux's ``VmHWM`` (with the peaks a client update's
    measurement reset, ``raysim.runtime.memory.peak_rss_bytes``), else ``ru_maxrss``.

    Not ``ru_maxrss`` where ``VmHWM`` exists: Linux carries a process's ``ru_maxrss`` across
    ``exec``, so a child of a large parent starts at the parent's size (measured: a child of a
    1.5 GB process reported 1.5 GB; its ``VmHWM`` 11 MB).
    """
    from raysim.runtime.memory import peak_rss_bytes

    if peak := peak_rss_bytes():
        return peak / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB; macOS: bytes


def _run_rounds(job: Any, out: Path) -> dict[str, Any]:
    """Builds the run and times each round's sampling and the round itself."""
    from raysim.engine.build import build
    from raysim.tracking.tracker import MemoryTracker

    services, state = build(job, MemoryTracker(), None, out)
    sampling_s, round_s = [], []
    try:
        for round_num in range(job.engine.num_rounds):
            t0 = time.perf_counter()
            services.cohort(round_num)  # the round draws it again from the same (seed, round)
            sampling_s.append(time.perf_counter() - t0)
            state, _ = services.run_round(state, round_num)
            round_s.append(time.perf_counter() - t0)
    finally:
        services.backend.shutdown()
    return {"sampling_ms": 1e3 * statistics.median(sampling_s), "round_s": statistics.median(round_s)}


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="population: peak resident memory of each process, and sampling per round")
    for column in ("clients", "prepare MB", "prepare s", "run MB (driver)", "sampling ms", "round s"):
        table.add_column(column, justify="right")
    for row in rows:
        prepared, ran = row["prepare"], row["run"]
        table.add_row(
            f"{row['num_clients']:,}",
            f"{prepared['peak_mb']:.0f}",
            f"{prepared['seconds']:.1f}",
            f"{ran['peak_mb']:.0f}",
            f"{ran['sampling_ms']:.2f}",
            f"{ran['round_s']:.2f}",
        )
    return table
