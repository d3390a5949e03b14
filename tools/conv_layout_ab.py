"""Channels-last against contiguous convolutions in raysim's own local training, paired per client.

Builds a job's first worker in this process (the serial backend, one torch thread), reads its
clients' round-0 data, and trains each client twice from the same weights, once with
``channels_last: on`` and once ``off``, in alternating order; prints the median of the per-client
time ratios (on / off) with its interquartile range. Paired so that a noisy machine's drift falls
on both sides of each ratio alike (docs/performance.md, "Channels-last convolutions").

Usage (from the repository root):
    python tools/conv_layout_ab.py jobs/quickstart.yaml [key=value ...]   # a job file or a bench file
    CLIENTS=6 REPEATS=3 python tools/conv_layout_ab.py jobs/bench/pfl_cifar10.yaml model.name=simple_cnn \
        algorithm.local.batch_size=64
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from raysim.bench.bench_file import load_benchmark
from raysim.config import JobConfig
from raysim.config.files import load_jobs
from raysim.engine.build import build
from raysim.plugin_defaults import local_section
from raysim.runtime.backend import SerialBackend
from raysim.tracking.tracker import MemoryTracker
from raysim.train.local import LocalTrainConfig, train_local


def first_worker(path: str, overrides: list[str]) -> tuple[JobConfig, SerialBackend, LocalTrainConfig]:
    """A job's first worker built in this process on one torch thread (the serial backend),
    and the plugin's local SGD section; ``tools/max_pool_ab.py`` measures on it too."""
    torch.set_num_threads(1)
    fixed = ["resources.backend=serial", "resources.num_workers=1", "tracking.enabled=false"]
    job = load_job(path, [*overrides, *fixed])
    services, _ = build(job, MemoryTracker(), None, Path(".raysim") / "bench")
    backend = services.backend
    assert isinstance(backend, SerialBackend)  # resources.backend=serial above
    local = local_section(job.algorithm.config)
    assert isinstance(local, LocalTrainConfig), f"{job.algorithm.name} has no local SGD section"
    return job, backend, local


def main(path: str, overrides: list[str]) -> None:
    job, backend, local = first_worker(path, overrides)
    trainer = backend.trainer
    configs = {mode: local.model_copy(update={"channels_last": mode}) for mode in ("on", "off")}
    model, spec = trainer.model, trainer.store.spec
    start = {k: v.clone() for k, v in model.state_dict().items()}
    clients = [trainer.training.round_data(c, 0) for c in range(int(os.environ.get("CLIENTS", "10")))]
    ratios: list[float] = []
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    for repeat in range(int(os.environ.get("REPEATS", "4"))):
        for i, data in enumerate(clients):
            took = {}
            for mode in ("on", "off") if (repeat + i) % 2 else ("off", "on"):
                model.load_state_dict(start)
                t0 = time.perf_counter()
                train_local(model, data, configs[mode], seed=i, spec=spec)
                took[mode] = time.perf_counter() - t0
                seconds[mode].append(took[mode])
            ratios.append(took["on"] / took["off"])
    backend.shutdown()
    ratios.sort()
    q = len(ratios) // 4
    print(
        f"{job.model.name}: channels-last / contiguous {statistics.median(ratios):.3f} "
        f"(IQR {ratios[q]:.3f}-{ratios[-q - 1]:.3f}, {len(ratios)} client pairs); ms a client "
        f"{statistics.median(seconds['on']) * 1e3:.1f} on, {statistics.median(seconds['off']) * 1e3:.1f} off"
    )


def load_job(path: str, overrides: list[str]) -> JobConfig:
    """A job file's first job, or a bench file's job (its ``bench:`` section aside)."""
    raw = yaml.safe_load(Path(path).read_text())
    if isinstance(raw, dict) and "bench" in raw:
        return load_benchmark(path, overrides)[0]
    return load_jobs(path, overrides)[0]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
