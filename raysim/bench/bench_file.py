"""A benchmark file: a job file plus a ``bench:`` section, read and checked before anything runs
(``raysim bench``'s rounds in ``bench.py``, its population sizes in ``population_bench.py``).

Usage:
    job, bench = load_benchmark("jobs/bench/pfl_cifar10.yaml", ["engine.num_rounds=4"])
    device = bench_device(job, bench)   # where the plain loop and the vectorized side train
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, PositiveInt, ValidationError

from raysim.bench.plain_loop import plain_local
from raysim.config import JobConfig, apply_overrides, explain
from raysim.config.files import read_job_file
from raysim.errors import ConfigError


class BenchConfig(BaseModel, frozen=True, extra="forbid"):
    warmup_rounds: int = Field(1, ge=0)
    # population sizes: driver memory and sampling time per size (raysim.bench.population_bench)
    populations: list[PositiveInt] = Field(default_factory=list)
    startup: bool = True  # also time start-up, in fresh processes (raysim.bench.startup)
    # where the plain loop and the vectorized side train (auto: the GPU when the job asks for one)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # time the plain loop beside raysim; false: raysim's rounds alone (the loop's data still read,
    # for examples/s and tokens/s), for cohorts whose plain loop would take minutes a round
    plain_loop: bool = True


def load_benchmark(path: str | Path, overrides: list[str]) -> tuple[JobConfig, BenchConfig]:
    raw = apply_overrides(read_job_file(Path(path)), overrides)  # a job file with a bench: section
    try:
        bench = BenchConfig.model_validate(raw.pop("bench", {}) or {})
    except ValidationError as exc:
        raise ConfigError(explain(exc, BenchConfig, "bench."), str(path)) from None
    job = JobConfig.from_dict(raw, str(path))
    if job.engine.num_rounds <= bench.warmup_rounds:
        raise ConfigError([f"engine.num_rounds must exceed bench.warmup_rounds ({bench.warmup_rounds})"])
    plain_local(job)  # the plain loop can repeat the plugin's local training
    bench_device(job, bench)
    return job, bench


# A card's rounds vary more than their count suggests (host synchronisation, clocks): a figure on
# a GPU rests on at least these many rounds.
GPU_WARMUP_ROUNDS, GPU_TIMED_ROUNDS = 2, 10


def check_gpu_rounds(job: JobConfig, bench: BenchConfig, device: torch.device) -> None:
    """Refuses a benchmark on a GPU with fewer than 2 warm-up or 10 timed rounds.

    Raises:
        ConfigError: naming the keys to raise.
    """
    timed = job.engine.num_rounds - bench.warmup_rounds
    if device.type == "cuda" and (bench.warmup_rounds < GPU_WARMUP_ROUNDS or timed < GPU_TIMED_ROUNDS):
        raise ConfigError(
            [
                f"bench: on a GPU a figure needs at least {GPU_WARMUP_ROUNDS} warm-up and {GPU_TIMED_ROUNDS} "
                f"timed rounds, got {bench.warmup_rounds} and {timed}; raise bench.warmup_rounds and "
                f"engine.num_rounds (e.g. {GPU_WARMUP_ROUNDS} and {GPU_WARMUP_ROUNDS + GPU_TIMED_ROUNDS})"
            ]
        )


def bench_device(job: JobConfig, bench: BenchConfig) -> torch.device:
    """Where the plain loop and the vectorized side train.

    Raises:
        ConfigError: ``bench.device: cuda`` where torch sees no CUDA device.
    """
    cuda = torch.cuda.is_available()
    if bench.device == "cuda" and not cuda:
        raise ConfigError(["bench.device: cuda, but torch sees no CUDA device here; use cpu or auto"])
    wants_gpu = bench.device == "cuda" or (bench.device == "auto" and bool(job.resources.gpus_per_worker))
    return torch.device("cuda" if wants_gpu and cuda else "cpu")
