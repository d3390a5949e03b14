"""The GPU check: raysim's GPU tests, its benchmark and two workers sharing one card, in one go.

Written for the GPU machines (Python 3.12, a CUDA torch, no Ray, no pydantic, no network). It
unpacks ``.gpu/site-cpXY.tar.xz`` (``make gpu-bundle`` builds it here) onto PYTHONPATH, then runs
each step in its own process, with a time limit, and writes every step's outcome and figures to
``OUT/gpu_check.json`` and their output to ``OUT/gpu_check.log``:

1. ``ray``: a local Ray starts and runs a task. If it cannot, the steps that need Ray are skipped
   and the benchmark runs on the serial backend; the JSON says so.
2. ``pytest``: the tests marked ``gpu`` (``pytest -m gpu`` over the files that hold such tests).
3. ``bench``: ``raysim bench jobs/bench/pfl_cifar10_gpu.yaml`` with its defaults
   (``gpus_per_worker: auto``, ``vectorize: auto``): the layout raysim measured fastest and the
   alternatives' clients/s, seconds per round, clients/s, and the vectorized side against the
   plain loop on the same GPU.
4. ``two_workers`` (``gpu_two_workers.py``): a run with two Ray workers on one GPU
   (``gpus_per_worker: 0.5``), each card process's peak memory read from NVML while they train;
   then two raysim workers each allocate 80% of their slice, which must succeed, and 110%, which
   must fail: the slice is enforced.
5. ``bench_cohort1000``: cohort 1,000 on the CIFAR shape in the measured layout, clients/s;
   ``bench_lm``: ``jobs/bench/lm_lora.yaml`` with the small decoder, tokens/s against a plain
   HuggingFace loop; ``bench_lm_vectorized``: the same, batched LoRA (``engine.vectorize=on``);
   ``bench_lm_population``: a 10,000-client LoRA population, tokens/s and clients/s.

The steps share one deadline (``TOTAL_S``): a step gets its own limit or what is left of it, and
the JSON is written after every step, so a check cut short still reports what it measured.

Without a CUDA device it stops, unless ``--cpu-dry-run``: then every step runs on the CPU, small,
so the whole path can be seen working on a development machine (the slice step then only builds
the workers).

Usage:
    python3 tools/gpu_check.py --out "$OUT"          # on the GPU machine (make gpu-check)
    python3 tools/gpu_check.py --cpu-dry-run          # here (make gpu-check-dry)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from gpu_check_rows import summary  # beside this script

REPO = Path(__file__).resolve().parents[1]
DEADLINE = float("inf")  # perf_counter's time by which every step must end (check sets it)
BENCH_JOB = "jobs/bench/pfl_cifar10_gpu.yaml"
COHORT_JOB = "jobs/bench/pfl_cifar10_cohort1000.yaml"
MIB = 2**20
# Seconds per step: the whole check must end well inside one 10-minute command.
LIMITS = {
    "ray": 60, "pytest": 150, "bench": 150, "two_workers": 90, "bench_cohort1000": 180, "bench_lm": 90,
    "bench_lm_vectorized": 90, "bench_lm_population": 120,
}  # fmt: skip
TOTAL_S = 555  # the whole check: about 9 minutes of an H100, inside one 10-minute command
# The dry run shrinks the benchmark's job to what 2 CPU cores train in seconds (both Ray steps).
DRY_RUN = [
    "dataset.num_examples=2000", "dataset.partition.num_clients=100", "engine.num_rounds=3",
    "engine.cohort_size=10", "resources.num_workers=2", "resources.cpus_per_worker=1",
    "resources.gpus_per_worker=0",
]  # fmt: skip
LM_DRY_RUN = [
    "dataset.num_clients=20", "dataset.words_per_client=300", "dataset.seq_len=64",
    "engine.num_rounds=2", "engine.cohort_size=4", "resources.gpus_per_worker=0",
]  # fmt: skip
# a GPU figure rests on at least 2 warm-up and 10 timed rounds (raysim.bench.bench_file)
LM_GPU = [
    "model.preset=small",
    "resources.gpus_per_worker=1",
    "engine.num_rounds=12",
    "bench.warmup_rounds=2",
]
COHORT_DRY_RUN = [o for o in DRY_RUN if not o.startswith("engine.cohort_size=")] + ["engine.cohort_size=40"]
POPULATION_DRY_RUN = [
    "dataset.num_clients=200", "dataset.words_per_client=200", "dataset.seq_len=32",
    "engine.num_rounds=3", "engine.cohort_size=8", "resources.gpus_per_worker=0",
]  # fmt: skip
# The benchmarks: step -> (benchmark file, overrides on a GPU, overrides in a CPU dry run).
BENCHES = {
    "bench": (BENCH_JOB, [], DRY_RUN),  # the job's defaults: the layout measured fastest
    # 4 CPUs a worker: 1, 2 and 4 workers a card timed (16 cores), a pool start fewer than 8 would cost
    "bench_cohort1000": (COHORT_JOB, ["resources.cpus_per_worker=4"], COHORT_DRY_RUN),
    "bench_lm": ("jobs/bench/lm_lora.yaml", LM_GPU, LM_DRY_RUN),
    "bench_lm_vectorized": (
        "jobs/bench/lm_lora.yaml",
        [*LM_GPU, "engine.vectorize=on"],
        [*LM_DRY_RUN, "engine.vectorize=on"],
    ),
    "bench_lm_population": (
        "jobs/bench/lm_population.yaml",
        ["model.preset=small", "resources.gpus_per_worker=1"],
        POPULATION_DRY_RUN,
    ),
}
# sequential, as measured before the bench job took the auto defaults: peaks comparable across runs
TWO_WORKERS = [
    "resources.num_workers=2", "resources.gpus_per_worker=0.5", "resources.cpus_per_worker=2",
    "engine.vectorize=off",
]  # fmt: skip


# ---------------------------------------------------------------- the driver: one process per step


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default=os.environ.get("OUT") or "build/gpu-check", help="folder for the results"
    )
    parser.add_argument("--cpu-dry-run", action="store_true", help="no GPU: run every step small, on the CPU")
    args = parser.parse_args()
    return check(Path(args.out).resolve(), args.cpu_dry_run)


def check(out: Path, dry: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "gpu_check.log").open("w")
    report: dict[str, Any] = {"machine": machine(), "carried_mib": round(travelled_bytes() / MIB, 1)}
    report["bundle"] = unpack_bundle()
    env = step_env(report["bundle"].get("site"))
    cuda = report["machine"].get("cuda_devices", 0) > 0
    say(log, f"{json.dumps(report, indent=2)}\n")
    if not cuda and not dry:
        report["error"] = "no CUDA device: run with --cpu-dry-run to check the path on the CPU"
        return finish(out, report, log)
    report["mode"] = "gpu" if cuda else "cpu-dry-run"
    steps: dict[str, Any] = {}
    report["steps"] = steps
    global DEADLINE
    DEADLINE = time.perf_counter() + TOTAL_S
    steps["ray"], _ = run_step(log, "ray", [sys.executable, "-c", RAY_PROBE], env)
    has_ray = steps["ray"]["ok"]
    # the slice step right after the first bench: the checks of 2026-11-27 before the scale benches
    for name in ("pytest", "bench", "two_workers", *list(BENCHES)[1:]):
        write_report(out, report)  # a check cut short still leaves what it measured
        if name == "pytest":
            steps[name] = gpu_tests(log, env, cuda) if has_ray else skipped("the gpu tests need Ray")
        elif name in BENCHES:
            steps[name] = bench(log, env, name, dry, has_ray)
        else:
            steps[name] = two_workers(log, env, out, dry) if has_ray else skipped("fractional GPUs need Ray")
    report["passed"] = all(step["ok"] for step in steps.values())  # a skipped step is no pass
    return finish(out, report, log)


def two_workers(log: Any, env: dict[str, str], out: Path, dry: bool) -> dict[str, Any]:
    """``gpu_two_workers.py``: two Ray workers on one card, each held to its half."""
    two = [sys.executable, str(Path(__file__).with_name("gpu_two_workers.py")), "--out", str(out)]
    two += ["--cpu-dry-run"] * dry
    (out / "two_workers.json").unlink(missing_ok=True)  # the step writes it afresh
    result, _ = run_step(log, "two_workers", two, env)
    return result | read_json(out / "two_workers.json")


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")


def finish(out: Path, report: dict[str, Any], log: Any) -> int:
    write_report(out, report)
    say(log, f"\n{summary(report)}\nwritten: {out / 'gpu_check.json'}, {out / 'gpu_check.log'}\n")
    log.close()
    return 0 if report.get("passed") else 1


def say(log: Any, text: str) -> None:
    print(text, end="", flush=True)
    log.write(text)
    log.flush()


def machine() -> dict[str, Any]:
    """Python, torch and the card; a torch that cannot be imported is worth knowing first."""
    info: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    import torch

    info["torch"] = torch.__version__
    info["cuda_devices"] = torch.cuda.device_count()
    if info["cuda_devices"]:
        props = torch.cuda.get_device_properties(0)
        info["card"] = torch.cuda.get_device_name(0)
        info["card_memory_mib"] = props.total_memory // MIB
        info["cuda"] = torch.version.cuda
    else:
        info["card"] = None
    return info


def travelled_bytes() -> int:
    """What came with the command: the repository's files and the carried .gpu folder."""
    skip = {".git", "__pycache__", ".raysim", "build", ".venv", ".mypy_cache", ".ruff_cache"}
    total = 0
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip]
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def unpack_bundle() -> dict[str, Any]:
    """Unpacks ``.gpu/site-cpXY.tar.xz`` for this Python into a temporary folder."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    bundle = REPO / ".gpu" / f"site-{tag}.tar.xz"
    if not bundle.is_file():
        return {"path": None, "note": f"no {bundle.relative_to(REPO)}: only what is installed here"}
    t0 = time.perf_counter()
    site = Path(tempfile.mkdtemp(prefix="raysim-gpu-site-"))
    with tarfile.open(bundle) as tar:
        tar.extractall(site, filter="tar")  # keeps the binaries' exec bits
    return {
        "path": str(bundle.relative_to(REPO)),
        "mib": round(bundle.stat().st_size / MIB, 1),
        "site": str(site),
        "unpack_s": round(time.perf_counter() - t0, 1),
    }


def step_env(site: str | None) -> dict[str, str]:
    """The steps' environment: the bundle and the checkout importable (Ray's workers inherit it),
    everything offline, tracking off."""
    paths = [p for p in (site, str(REPO), os.environ.get("PYTHONPATH")) if p]
    cache = tempfile.mkdtemp(prefix="raysim-gpu-cache-")
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAYSIM_CACHE": cache,
        "MLFLOW_TRACKING_URI": f"sqlite:///{cache}/mlflow.db",  # never used: tracking is off
    }


RAY_PROBE = """
from raysim.runtime.ray_session import start_local_ray
import ray
start_local_ray(num_cpus=1, log_to_driver=False)
print("ray", ray.__version__, "resources", ray.cluster_resources())
assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
ray.shutdown()
"""


def run_step(log: Any, name: str, command: list[str], env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """Runs one step in a session of its own, killed whole at its time limit (Ray's processes
    too); its outcome, and its output, which also goes to the log (through a file, which no
    leftover process can hold open)."""
    limit = min(LIMITS[name], int(DEADLINE - time.perf_counter()))
    if limit < 10:
        return skipped(f"the check's {TOTAL_S} s were spent"), ""
    say(log, f"\n===== {name} (at most {limit} s): {' '.join(command)}\n")
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as output:
        child = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
        output.seek(0)
        text = output.read()
    seconds = round(time.perf_counter() - t0, 1)
    say(log, text)
    result: dict[str, Any] = {"ok": code == 0, "seconds": seconds}
    if code is None:
        result["error"] = f"killed after {limit} s"
    elif code:
        result["error"] = f"exit {code}: " + " | ".join(text.strip().splitlines()[-3:])
    say(log, f"----- {name}: {'ok' if code == 0 else 'FAILED'} in {seconds} s\n")
    return result, text


def skipped(why: str) -> dict[str, Any]:
    return {"ok": False, "skipped": why}


def pytest_command() -> list[str]:
    """``pytest -m gpu`` over the test files with a test decorated ``@pytest.mark.gpu`` (collecting
    every file would import MLflow, which the GPU machines lack)."""
    marked = re.compile(r"^\s*@pytest\.mark\.gpu\b", re.M)
    files = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if marked.search(p.read_text())
    )
    return [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider", *files]


def gpu_tests(log: Any, env: dict[str, str], cuda: bool) -> dict[str, Any]:
    """The gpu-marked tests; on a GPU machine each must run and pass (a skip there is a failure)."""
    result, output = run_step(log, "pytest", pytest_command(), env)
    result["tests"] = pytest_tally(output)
    if cuda and result["ok"] and not all_ran_and_passed(result["tests"]):
        result["ok"] = False
        result["error"] = f"on a GPU every gpu test must run and pass: {result['tests']}"
    return result


def pytest_tally(output: str) -> dict[str, int]:
    """pytest's closing counts (``1 passed, 5 deselected in 9.1s`` -> {"passed": 1})."""
    tally = re.compile(r"(\d+) (passed|failed|skipped|errors?)\b")
    last = next((line for line in reversed(output.splitlines()) if tally.search(line)), "")
    return {outcome: int(n) for n, outcome in tally.findall(last)}


def all_ran_and_passed(tally: dict[str, int]) -> bool:
    return tally.get("passed", 0) > 0 and set(tally) == {"passed"}


def bench(log: Any, env: dict[str, str], name: str, dry: bool, has_ray: bool) -> dict[str, Any]:
    """``raysim bench`` on one of ``BENCHES``; its figures come from the JSON file it writes."""
    job_file, on_gpu, on_cpu = BENCHES[name]
    overrides = list(on_cpu if dry else on_gpu)
    if not has_ray:  # one process, which on a GPU machine has the whole card
        overrides += ["resources.backend=serial", "resources.num_workers=1"]
        overrides += [] if dry else ["resources.gpus_per_worker=1"]
    command = [sys.executable, "-m", "raysim", "bench", job_file, *overrides]
    import yaml

    figures = REPO / ".raysim" / "bench" / f"{yaml.safe_load((REPO / job_file).read_text())['name']}.json"
    figures.unlink(missing_ok=True)
    result, _ = run_step(log, name, command, env)
    result["backend"] = "ray" if has_ray else "serial"
    result["overrides"] = overrides
    found = read_json(figures)
    keep = (
        "device",
        "num_workers",
        "raysim_round_s",
        "plain_round_s",
        "ratio_to_ideal",
        "throughput_vs_ideal",
        "raysim_clients_per_s",
        "plain_clients_per_s",
        "raysim_examples_per_s",
        "plain_examples_per_s",
        "raysim_tokens_per_s",
        "plain_tokens_per_s",
        "driver_overhead_s",
        "vectorized_round_s",
        "vectorized_vs_plain",
        "vectorized_clients_per_s",
        "ratio_to_ideal_iqr",
        "round_spread_s",  # the rounds' variation and the phase it comes from (item 5's question)
        "spread_phase",
        "spread_phase_s",
        "phase_spread_s",
        "raysim_rounds_s",
        "raysim_round_phases",
    )
    result.update({k: found[k] for k in keep if k in found})
    result.update({k: v for k, v in found.items() if k.startswith("gpu_")})  # the layout measured
    return result


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


if __name__ == "__main__":
    sys.exit(main())
