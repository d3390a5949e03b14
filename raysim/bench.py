"""``raysim bench``: raysim's seconds per round against a plain PyTorch loop, in one run.

The plain loop is the limit: one process, one thread, the model built once, every client's data
already in memory as tensors, and nothing else. It trains the same cohorts with the same
hyper-parameters. Its time divided by raysim's worker count is the ideal parallel time; the
reported ratio (raysim / ideal) is the engine's overhead, 1.00 being none.

A benchmark file is a job file plus a ``bench:`` section.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from raysim.config import JobConfig, apply_overrides, explain
from raysim.data import ClientStore, open_dataset
from raysim.engine import run
from raysim.errors import ConfigError
from raysim.sampling import sample_cohort
from raysim.tracking import MemoryTracker
from raysim.worker import build_job_model


class BenchConfig(BaseModel, frozen=True, extra="forbid"):
    warmup_rounds: int = Field(1, ge=0)


def load_benchmark(path: str | Path, overrides: list[str]) -> tuple[JobConfig, BenchConfig]:
    raw = yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
    if not isinstance(raw, dict):
        raise ConfigError([f"no benchmark file (a YAML mapping) at {path}"])
    raw = apply_overrides(raw, overrides)
    try:
        bench = BenchConfig.model_validate(raw.pop("bench", {}) or {})
    except Exception as exc:
        raise ConfigError(explain(exc, BenchConfig, "bench."), str(path)) from None
    job = JobConfig.from_dict(raw, str(path))
    if job.engine.num_rounds <= bench.warmup_rounds:
        raise ConfigError([f"engine.num_rounds must exceed bench.warmup_rounds ({bench.warmup_rounds})"])
    return job, bench


def run_benchmark(path: str | Path, overrides: list[str], console: Console) -> dict[str, Any]:
    job, bench = load_benchmark(path, overrides)
    store = open_dataset(job.dataset.name, job.dataset.config)
    timed_rounds = job.engine.num_rounds - bench.warmup_rounds
    console.print(f"[bold]{job.name}[/]: {store.num_clients} clients, cohort {job.engine.cohort_size}, "
                  f"{timed_rounds} timed rounds after {bench.warmup_rounds} warm-up")
    result = run(job, tracker=MemoryTracker(), output_dir=Path(".raysim") / "bench")
    timed = [m["sys/round_s"] for step, m in result.history if step >= bench.warmup_rounds]
    raysim_s = statistics.median(timed)
    num_workers = int(result.history[-1][1].get("sys/num_workers", 1))
    plain_s = statistics.median(plain_loop_seconds(job, store, bench.warmup_rounds))
    ideal_s = plain_s / num_workers
    figures = {"benchmark": job.name, "num_workers": num_workers, "raysim_round_s": raysim_s,
               "plain_round_s": plain_s, "ideal_round_s": ideal_s, "ratio_to_ideal": raysim_s / ideal_s,
               "raysim_clients_per_s": job.engine.cohort_size / raysim_s,
               "plain_clients_per_s": job.engine.cohort_size / plain_s}
    console.print(_table(figures))
    out = Path(".raysim") / "bench" / f"{job.name}.json"
    out.write_text(json.dumps(figures, indent=2))
    console.print(f"figures written to {out}")
    return figures


def plain_loop_seconds(job: JobConfig, store: ClientStore, warmup_rounds: int) -> list[float]:
    """Seconds per round of the plain single-thread loop over the same cohorts."""
    torch.set_num_threads(1)
    model = build_job_model(job, store.spec)
    local = job.algorithm.config.local
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    seconds = []
    for round_num in range(job.engine.num_rounds):
        cohort = sample_cohort(store.num_clients, job.engine.cohort_size, job.seed, round_num)
        data = [(torch.from_numpy(d.arrays["x"].copy()), torch.from_numpy(d.arrays["y"].copy()))
                for d in (store.client_data(int(c), "train") for c in cohort)]
        t0 = time.perf_counter()
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        for x, y in data:
            model.load_state_dict(global_state)
            optimizer = torch.optim.SGD(model.parameters(), lr=local.lr)
            for _ in range(local.epochs):
                order = torch.randperm(len(x))
                for start in range(0, len(x), local.batch_size):
                    idx = order[start:start + local.batch_size]
                    optimizer.zero_grad()
                    F.cross_entropy(model(x[idx]), y[idx]).backward()
                    optimizer.step()
            for k, v in model.state_dict().items():
                total[k] += (global_state[k] - v).double() * len(x)
        global_state = {k: global_state[k] - (total[k] / sum(len(x) for x, _ in data)).to(v.dtype)
                        for k, v in global_state.items()}
        if round_num >= warmup_rounds:
            seconds.append(time.perf_counter() - t0)
    return seconds


def _table(f: dict[str, Any]) -> Table:
    table = Table(title=f"{f['benchmark']}: seconds per round (median)")
    for column in ("raysim", "plain loop (1 thread)", f"ideal ({f['num_workers']} workers)",
                   "raysim / ideal", "raysim clients/s"):
        table.add_column(column, justify="right")
    table.add_row(f"{f['raysim_round_s']:.3f}", f"{f['plain_round_s']:.3f}", f"{f['ideal_round_s']:.3f}",
                  f"{f['ratio_to_ideal']:.3f}x", f"{f['raysim_clients_per_s']:.1f}")
    return table
