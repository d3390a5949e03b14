"""The GPU check's fourth step, in a process of its own: two Ray workers share one GPU.

A run with two workers at ``gpus_per_worker: 0.5`` on the GPU benchmark's job, each card
process's peak memory read from NVML while they train; then two raysim workers (``ClientTrainer``,
built as the Ray backend builds them) each allocate 80% of their slice, which must succeed, and
110%, which must fail: the slice is enforced. ``tools/gpu_check.py`` runs it and reads
``OUT/two_workers.json``.

Usage:
    python3 tools/gpu_two_workers.py --out "$OUT" [--cpu-dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gpu_check import BENCH_JOB, DRY_RUN, MIB, REPO, TWO_WORKERS


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for two_workers.json")
    parser.add_argument("--cpu-dry-run", action="store_true", help="no GPU: only build the workers")
    args = parser.parse_args()
    return two_workers(Path(args.out), args.cpu_dry_run)


def two_workers(out: Path, dry: bool) -> int:
    """A Ray run of two workers per GPU, then the slice each worker is held to."""
    import ray

    from raysim.bench.bench_file import load_benchmark
    from raysim.engine.build import build
    from raysim.runtime.ray_placement import worker_setup_for
    from raysim.runtime.wire import WorkerSetup
    from raysim.tracking.tracker import MemoryTracker

    job, _ = load_benchmark(REPO / BENCH_JOB, DRY_RUN if dry else TWO_WORKERS)
    resources = job.resources
    result: dict[str, Any] = {"workers": resources.num_workers, "gpus_per_worker": resources.gpus_per_worker}
    engine, state = build(job, MemoryTracker(), None, Path(tempfile.mkdtemp(prefix="raysim-two-")))
    watch = CardWatch()
    round_s = []
    try:
        for round_num in range(job.engine.num_rounds):
            t0 = time.perf_counter()
            state, _ = engine.run_round(state, round_num)
            round_s.append(time.perf_counter() - t0)
    finally:
        engine.backend.shutdown()
        watch.stop()
    timed = sorted(round_s[1:] or round_s)  # the first round pays for the workers' start-up
    result["round_s"] = [round(s, 3) for s in round_s]
    result["clients_per_s"] = round(job.engine.cohort_size / timed[len(timed) // 2], 1)  # median round
    result["card_used_peak_mib"] = watch.card_peak
    result["card_processes_peak_mib"] = watch.peaks  # pid -> MiB: the workers, and the driver (below)
    result["driver_pid"] = os.getpid()
    setup = worker_setup_for(
        WorkerSetup(job=job.to_dict(), store_path=str(engine.store.path), state_dir=tempfile.mkdtemp()),
        resources,
    )
    probe: Any = ray.remote(_slice_probe_class())
    place = {"num_cpus": resources.cpus_per_worker, "num_gpus": resources.gpus_per_worker}
    workers = [probe.options(**place).remote(setup) for _ in range(2)]
    result["slices"] = [ray.get(w.held_to.remote(setup.gpu_memory_fraction)) for w in workers]
    result["enforced"] = bool(result["slices"]) and all(s.get("enforced") for s in result["slices"])
    result["same_card"] = len({s.get("card_uuid") for s in result["slices"]}) == 1
    ray.shutdown()
    (out / "two_workers.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if dry or (result["enforced"] and result["same_card"]) else 1


class CardWatch:
    """Polls NVML every 0.2 s for each process's memory on the card; keeps each one's peak."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.card_peak: int | None = None  # the whole card's used memory, all processes
        self._stop = threading.Event()
        try:
            import pynvml  # nvidia-ml-py, on the GPU machines

            pynvml.nvmlInit()
            self._card = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception as exc:  # no NVML (a CPU dry run): no per-process figures
            self.peaks = {"unavailable": str(exc)[:200]}  # type: ignore[dict-item]
            return
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            used = self._nvml.nvmlDeviceGetMemoryInfo(self._card).used // MIB
            self.card_peak = max(self.card_peak or 0, used)
            for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._card):
                if p.usedGpuMemory is not None:
                    key = str(p.pid)
                    self.peaks[key] = max(self.peaks.get(key, 0), p.usedGpuMemory // MIB)

    def stop(self) -> None:
        self._stop.set()


def _slice_probe_class() -> type:
    """``ClientTrainer`` plus one method: raysim's own worker start-up sets the memory slice."""
    from raysim.runtime.worker import ClientTrainer

    class SliceProbe(ClientTrainer):
        def held_to(self, fraction: float | None) -> dict[str, Any]:
            """Allocates 80% of the slice (must succeed) and 110% (must fail with out-of-memory)."""
            import torch

            report: dict[str, Any] = {"pid": os.getpid(), "device": str(self.device), "fraction": fraction}
            if self.device.type != "cuda" or fraction is None:
                report["note"] = "no slice: the worker has the whole device (or runs on the CPU)"
                return report
            props = torch.cuda.get_device_properties(self.device)
            report["card_uuid"] = str(getattr(props, "uuid", ""))
            report["slice_mib"] = int(fraction * props.total_memory) // MIB
            report["fits_80pct"] = _allocates(int(0.8 * fraction * props.total_memory), self.device)
            report["fits_110pct"] = _allocates(int(1.1 * fraction * props.total_memory), self.device)
            report["peak_allocated_mib"] = torch.cuda.max_memory_allocated(self.device) // MIB
            report["enforced"] = report["fits_80pct"] and not report["fits_110pct"]
            return report

    return SliceProbe


def _allocates(num_bytes: int, device: Any) -> bool:
    import torch

    try:
        block = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError:
        return False
    del block
    torch.cuda.empty_cache()
    return True


if __name__ == "__main__":
    sys.exit(main())
