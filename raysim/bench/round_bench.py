"""``raysim bench``: raysim's seconds per round against a plain PyTorch loop, in one run.

The plain loop is the limit: one process, one thread, the model built once, every client's data
already in memory as tensors, and nothing else. It trains the same cohorts with the same
hyper-parameters, one round after each raysim round. Its time divided by the cores raysim's
workers train on (``training_cores``: workers times their threads on a CPU) is the linear ideal
parallel time; the reported ratio (raysim / ideal) is the engine's overhead, 1.00 being none,
together with what the cores themselves lose. Each comparison has one headline, the ratio of the
two sides' median rounds, printed with the interquartile range of its per-round ratios and the
number of timed rounds (``raysim.bench.comparison``); throughputs are totals over totals. On a CPU
with more than one core the ideal is also measured (``ParallelPlainLoop``: the plain loop in one
process per core), and raysim / that is the engine's overhead alone.

Where the plugin and model vectorize, a third side trains each cohort in chunks at once
(``bench_vectorized.py``); ``vectorized_vs_plain`` is its time per step over the plain loop's.

Both sides train on ``bench.device``: the CPU, or the GPU a job with ``resources.gpus_per_worker``
asks for (``auto``), so that on a GPU machine the plain loop is the same loop on the same card.

A benchmark file is a job file plus a ``bench:`` section (``raysim.bench.bench_file``).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from raysim.bench.bench_file import bench_device, check_gpu_rounds, load_benchmark
from raysim.bench.bench_vectorized import VectorizedSide
from raysim.bench.comparison import Ratio
from raysim.bench.plain_loop import ParallelPlainLoop, PlainLoop
from raysim.bench.startup import startup_seconds, startup_table
from raysim.config import JobConfig
from raysim.engine.build import build
from raysim.engine.round_timer import WALL
from raysim.tracking.tracker import MemoryTracker

PHASE_PREFIX = "sys/time/"  # the round timer's phases (raysim.engine.round_timer)


def run_benchmark(path: str | Path, overrides: list[str], console: Console) -> dict[str, Any]:
    """Alternates one raysim round and the plain loop's round on the same cohort.

    Interleaving exposes both to the same machine conditions (shared or throttled CPUs drift by
    tens of percent over a minute), so their ratio is measured, not their luck.
    """
    job, bench = load_benchmark(path, overrides)
    if bench.populations:  # a population file measures memory per size, not seconds per round
        from raysim.bench.population_bench import run_population_benchmark

        return {"populations": run_population_benchmark(path, overrides, bench.populations, console)}
    out = Path(".raysim") / "bench"
    tracker = MemoryTracker()
    services, state = build(job, tracker, None, out)
    device = bench_device(job, bench)
    check_gpu_rounds(job, bench, device)
    plain = PlainLoop(job, services.store, services.train_pool, device)
    vectorized = VectorizedSide.for_job(job, services.store, services.train_pool, device)
    cores = training_cores(job, services.backend.num_workers, device)
    parallel = (  # the ideal measured: the plain loop in one process per core raysim trains on
        ParallelPlainLoop(job, services.store, services.train_pool, cores)
        if device.type == "cpu" and cores > 1 and bench.plain_loop
        else None
    )
    timed_rounds = job.engine.num_rounds - bench.warmup_rounds
    console.print(
        f"[bold]{job.name}[/]: {services.store.num_clients} clients, cohort "
        f"{job.engine.cohort_size}, {services.backend.num_workers} workers, {timed_rounds} "
        f"timed rounds after {bench.warmup_rounds} warm-up; plain loop on {device.type}"
    )
    raysim_s, plain_s, overhead_s, tokens, vectorized_s, parallel_s = [], [], [], [], [], []
    phases: list[dict[str, float]] = []  # each timed round's split (sys/time/*): what varies
    try:
        for round_num in range(job.engine.num_rounds):
            t0 = time.perf_counter()
            state, metrics = services.run_round(state, round_num)
            raysim_round = time.perf_counter() - t0
            timer = services.take_round_timer(round_num)  # end_round's split, which a bench never calls
            metrics = metrics | (timer.metrics() if timer is not None else {})
            vectorized_round = vectorized.round(round_num, plain.global_state) if vectorized else 0.0
            plain_round = plain.round(round_num) if bench.plain_loop else plain.count(round_num)
            parallel_round = parallel.round(round_num) if parallel is not None else 0.0
            if round_num >= bench.warmup_rounds:
                raysim_s.append(raysim_round)
                plain_s.append(plain_round)
                overhead_s.append(metrics["sys/driver_overhead_s"])
                phases.append({k: float(v) for k, v in metrics.items() if k.startswith(PHASE_PREFIX)})
                tokens.append(plain.tokens)
                vectorized_s.append(vectorized_round)
                parallel_s.append(parallel_round)
    finally:
        services.backend.shutdown()
        if parallel is not None:
            parallel.close()
    workers = services.backend.num_workers
    if bench.plain_loop:
        figures = summarize(job, workers, cores, raysim_s, plain_s)
    else:
        figures = raysim_alone(job, workers, raysim_s)
    figures["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    figures["driver_overhead_s"] = statistics.median(overhead_s)
    figures["raysim_round_phases"] = phases
    figures |= phase_spread(phases)
    figures |= {k: v for k, v in tracker.tags.items() if k.startswith("gpu")}  # the measured layout
    unit = "tokens" if services.store.spec.task == "causal_lm" else "examples"
    figures[f"raysim_{unit}_per_s"] = sum(tokens) / sum(raysim_s)  # totals: the rounds as run
    if bench.plain_loop:
        figures[f"plain_{unit}_per_s"] = sum(tokens) / sum(plain_s)
        figures["throughput_vs_ideal"] = 1 / figures["ratio_to_ideal"]  # raysim / (plain x workers)
    if parallel is not None:
        figures["parallel_plain_round_s"] = statistics.median(parallel_s)
        figures |= Ratio.of(raysim_s, parallel_s).figures("ratio_to_parallel_plain")
        figures["parallel_plain_rounds_s"] = parallel_s
    if any(plain.fisher_s):
        figures["plain_fisher_share"] = statistics.median(
            f / p for f, p in zip(plain.fisher_s[bench.warmup_rounds :], plain_s)
        )
    if vectorized is not None:
        figures["vectorized_round_s"] = statistics.median(vectorized_s)
        figures["vectorized_clients_per_s"] = job.engine.cohort_size / figures["vectorized_round_s"]
        if bench.plain_loop:
            figures |= Ratio.of(vectorized_s, plain_s).figures("vectorized_vs_plain")
        figures["vectorized_rounds_s"] = vectorized_s
    console.print(_table(figures) if bench.plain_loop else _alone_table(figures))
    if bench.startup:
        figures |= startup_seconds(job)
        console.print(startup_table(figures))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{job.name}.json").write_text(json.dumps(figures, indent=2))
    console.print(
        f"outside the workers (broadcast, transfer, merge, server step): "
        f"{figures['driver_overhead_s']:.3f} s per round (median)"
    )
    if "spread_phase" in figures:
        console.print(
            f"raysim's rounds vary by {figures['round_spread_s']:.3f} s (interquartile range), most in "
            f"{figures['spread_phase']} ({figures['spread_phase_s']:.3f} s)"
        )
    if bench.plain_loop:
        console.print(
            f"{unit}/s over the timed rounds: raysim {figures[f'raysim_{unit}_per_s']:.0f}, plain loop "
            f"{figures[f'plain_{unit}_per_s']:.0f} (x{cores} cores ideal); "
            f"raysim reaches {figures['throughput_vs_ideal']:.3f} of the ideal (1 / raysim over ideal)"
        )
    else:
        console.print(f"{unit}/s over the timed rounds: raysim {figures[f'raysim_{unit}_per_s']:.0f}")
    if "plain_fisher_share" in figures:
        console.print(
            f"FedFish's Fisher pass is {figures['plain_fisher_share']:.0%} of the plain loop's "
            f"round (both sides run it)"
        )
    if vectorized is not None:
        against = ""
        if bench.plain_loop:
            against = f", {Ratio.of(vectorized_s, plain_s).text()} the plain loop's time per step"
        console.print(
            f"vectorized ({vectorized.chunk_size.size} clients at once, on {figures['device']}): "
            f"{figures['vectorized_round_s']:.3f} s per round (median)"
            f"{against}, {figures['vectorized_clients_per_s']:.1f} clients/s"
        )
    console.print(f"figures written to {out / f'{job.name}.json'}")
    return figures


def phase_spread(phases: list[dict[str, float]]) -> dict[str, Any]:
    """Where raysim's round-to-round variation comes from: the interquartile range of the rounds'
    wall time, and the phase (``sys/time/*``, wall time itself left out) whose own range is widest.
    Empty with fewer than two rounds or no phases."""
    wall = [p.get(WALL) for p in phases]
    names = sorted({k for p in phases for k in p} - {WALL})
    if len(phases) < 2 or not names or any(w is None for w in wall):
        return {}
    spread = {name: _iqr([p.get(name, 0.0) for p in phases]) for name in names}
    widest = max(names, key=spread.__getitem__)
    return {
        "round_spread_s": _iqr([w for w in wall if w is not None]),
        "spread_phase": widest.removeprefix(PHASE_PREFIX).removesuffix("_s"),
        "spread_phase_s": spread[widest],
        "phase_spread_s": spread,
    }


def _iqr(values: list[float]) -> float:
    low, high = np.percentile(values, [25, 75])
    return float(high - low)


def training_cores(job: JobConfig, num_workers: int, device: torch.device) -> int:
    """The cores raysim's workers train on, over which the ideal divides the plain loop: on the
    CPU under Ray, each worker's threads (``resources.cpus_per_worker``, as the worker sets them);
    else one per worker (a GPU's workers share its card, the serial backend's take turns)."""
    if device.type == "cpu" and job.resources.backend == "ray":
        return num_workers * max(1, int(job.resources.cpus_per_worker))
    return num_workers


def summarize(
    job: JobConfig, num_workers: int, cores: int, raysim_s: list[float], plain_s: list[float]
) -> dict[str, Any]:
    """Medians per round, and raysim over the ideal (plain / cores): the ratio of the medians, with
    the interquartile range of the per-round ratios (``Ratio``)."""
    raysim, plain = statistics.median(raysim_s), statistics.median(plain_s)
    return {
        "benchmark": job.name,
        "num_workers": num_workers,
        "cores": cores,
        "timed_rounds": len(raysim_s),
        "raysim_round_s": raysim,
        "plain_round_s": plain,
        "ideal_round_s": plain / cores,
        **Ratio.of(raysim_s, [p / cores for p in plain_s]).figures("ratio_to_ideal"),
        "raysim_clients_per_s": job.engine.cohort_size / raysim,
        "plain_clients_per_s": job.engine.cohort_size / plain,
        "raysim_rounds_s": raysim_s,
        "plain_rounds_s": plain_s,
    }


def raysim_alone(job: JobConfig, num_workers: int, raysim_s: list[float]) -> dict[str, Any]:
    """raysim's medians alone (``bench.plain_loop: false``: a cohort the plain loop would take
    minutes a round over)."""
    raysim = statistics.median(raysim_s)
    return {
        "benchmark": job.name,
        "num_workers": num_workers,
        "timed_rounds": len(raysim_s),
        "raysim_round_s": raysim,
        "raysim_clients_per_s": job.engine.cohort_size / raysim,
        "raysim_rounds_s": raysim_s,
    }


def _alone_table(f: dict[str, Any]) -> Table:
    table = Table(title=f"{f['benchmark']}: median of {f['timed_rounds']} timed rounds (no plain loop)")
    for column in ("raysim s/round", "raysim clients/s"):
        table.add_column(column, justify="right")
    table.add_row(f"{f['raysim_round_s']:.3f}", f"{f['raysim_clients_per_s']:.1f}")
    return table


def _table(f: dict[str, Any]) -> Table:
    table = Table(title=f"{f['benchmark']}: seconds per round (median of {f['timed_rounds']} timed rounds)")
    parallel = "parallel_plain_round_s" in f
    columns = ["raysim", "plain loop (1 thread)", f"ideal ({f['cores']} cores)", "raysim / ideal"]
    row = [f"{f['raysim_round_s']:.3f}", f"{f['plain_round_s']:.3f}", f"{f['ideal_round_s']:.3f}"]
    row.append(_with_spread(f, "ratio_to_ideal"))
    if parallel:  # the ideal measured: the plain loop in one process per core
        columns += [f"plain loop x{f['cores']} processes", "raysim / that"]
        row += [f"{f['parallel_plain_round_s']:.3f}", _with_spread(f, "ratio_to_parallel_plain")]
    for column in [*columns, "raysim clients/s"]:
        table.add_column(column, justify="right")
    table.add_row(*row, f"{f['raysim_clients_per_s']:.1f}")
    return table


def _with_spread(f: dict[str, Any], name: str) -> str:
    """A headline ratio with the interquartile range of its per-round ratios."""
    low, high = f[f"{name}_iqr"]
    return f"{f[name]:.3f}x (per-round IQR {low:.3f}-{high:.3f})"
