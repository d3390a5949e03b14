"""raysim's side of a peer comparison: a bench file's rounds alone, each timed around
``run_round`` as ``raysim bench`` times them, without its plain-loop and vectorized sides.

Usage (from the repository root):
    python tools/peers/raysim_rounds.py jobs/bench/pfl_cifar10.yaml [key=value ...]

Prints each round's seconds and, last, ``JSON {...}`` with the timed rounds' median (the first
``bench.warmup_rounds`` are left out), as ``tools/peers/pfl_cifar_shape.py`` prints pfl's, and the
median time outside the workers (the engine's ``sys/driver_overhead_s``, as ``raysim bench``
reports it) and the slowest worker's busy time (``sys/worker_busy_s``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from raysim.bench.bench_file import load_benchmark
from raysim.engine.build import build
from raysim.tracking.tracker import MemoryTracker


def main(path: str, overrides: list[str]) -> None:
    job, bench = load_benchmark(path, overrides)
    services, state = build(job, MemoryTracker(), None, Path(".raysim") / "bench")
    seconds, outside, busy = [], [], []
    try:
        for round_num in range(job.engine.num_rounds):
            t0 = time.perf_counter()
            state, metrics = services.run_round(state, round_num)
            seconds.append(time.perf_counter() - t0)
            outside.append(metrics["sys/driver_overhead_s"])
            busy.append(metrics["sys/worker_busy_s"])
            print(f"round {round_num}: {seconds[-1]:.3f} s", flush=True)
    finally:
        services.backend.shutdown()
    warm = bench.warmup_rounds
    timed = seconds[warm:]
    figures: dict[str, object] = {"median_s": statistics.median(timed), "rounds_s": timed}
    figures["outside_s"] = statistics.median(outside[warm:])
    figures["busy_s"] = statistics.median(busy[warm:])
    print("JSON " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
