"""Times each robust rule against FedAvg's weighted mean over the same stacked updates, for the
cost table of docs/robustness.md.

Each rule runs once on ``n`` random rows of ``d`` values (Gaussian, scale 1e-3, like updates), as
the driver's release runs it: ``raysim.robust.release.robust_vector`` in the column chunks
``raysim.robust.placement`` gives the device with no ``robust.memory_mb``. One run a figure, in
wall seconds and the process's CPU seconds (on a shared machine the CPU seconds of one thread,
``--threads 1``, are the steadier figure; the ratio to FedAvg is theirs).

Usage:
    python tools/robust_cost.py --size 50x1600000 --size 100x100000 [--device cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from raysim.config.robust import (
    CenteredClip,
    GeometricMedian,
    Krum,
    Median,
    MultiKrum,
    NormBound,
    RobustConfig,
    TrimmedMean,
)
from raysim.robust import placement
from raysim.robust.release import robust_vector

MiB = 2**20


def rules_for(n: int) -> list[tuple[str, RobustConfig | None]]:
    """FedAvg's weighted mean (None), then each rule with the options the table names."""
    f = n // 5  # 20% Byzantine, within Krum's n > 2f + 2
    return [
        ("weighted mean (FedAvg)", None),
        ("norm_bound", NormBound(rule="norm_bound", max_norm=1.0)),
        ("krum (f = n/5)", Krum(rule="krum", f=f)),
        ("multi_krum (f = n/5, m = n - f)", MultiKrum(rule="multi_krum", f=f)),
        ("median", Median(rule="median")),
        ("trimmed_mean (beta 0.1)", TrimmedMean(rule="trimmed_mean", beta=0.1)),
        ("geometric_median (defaults)", GeometricMedian(rule="geometric_median")),
        ("centered_clip (L = 3)", CenteredClip(rule="centered_clip", tau=1.0, iterations=3)),
    ]


def cost_rows(n: int, d: int, device: torch.device) -> list[tuple[str, float, float, str]]:
    """(rule, wall seconds, CPU seconds, its metrics) for each of ``rules_for(n)`` over ``n x d`` rows."""
    x = (torch.randn(n, d, generator=torch.Generator().manual_seed(0)) * 1e-3).to(device)
    weights = torch.ones(n, dtype=torch.float64)
    start = torch.zeros(d)
    chunk = placement.column_chunk(n, d, device, None)
    rows = []
    for name, rule in rules_for(n):
        robust_vector(rule, x[:, :1000], weights, start[:1000], chunk)  # first-call costs untimed
        t0, c0 = time.perf_counter(), time.process_time()
        _, metrics = robust_vector(rule, x, weights, start, chunk)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append((name, wall, cpu, ", ".join(f"{k.split('/')[-1]} {v:g}" for k, v in metrics.items())))
    return rows


def table(n: int, d: int, device: torch.device) -> str:
    """The markdown table for ``n x d``: seconds a round and the ratio to the weighted mean's."""
    rows = cost_rows(n, d, device)
    mean = max(rows[0][2], 1e-6)  # a clock tick: tiny sizes may take none
    lines = [
        f"n = {n}, d = {d:,} ({n * d * 4 / MiB:,.0f} MiB of float32 rows), {device}:",
        "",
        "| rule | wall s | CPU s | x FedAvg (CPU s) | measured |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {name} | {w:.2f} | {c:.2f} | {c / mean:.1f} | {m} |" for name, w, c, m in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", action="append", default=[], help="NxD: updates and values (repeatable)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for size in args.size or ["50x1600000", "100x100000"]:
        n, d = (int(part) for part in size.lower().split("x"))
        print(table(n, d, torch.device(args.device)), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
