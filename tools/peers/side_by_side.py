"""pfl-research and raysim on pfl's CIFAR-10 shape, in interleaved passes: the ratio of medians.

Each set runs one pass of pfl-research in 2 processes (``pfl_cifar_shape.py``, rank 1 in the
background) and one of raysim (``raysim_rounds.py``, its bench file's 2 workers), the first of
the two alternating from set to set, so that a machine that drifts weighs on both sides alike.
Prints each pass's median s/round, then both sides' medians over the sets, the ratio of those
medians (raysim / pfl-research, the headline of docs/performance.md's comparison) and each
set's own ratio: the spread that a single set would hide.

Usage (from the repository root; pfl-research 0.6.0 in a throwaway environment):
    python tools/peers/side_by_side.py --pfl-python pfl-env/bin/python --sets 3 [key=value ...]
The key=value overrides go to raysim's bench file (``jobs/bench/pfl_cifar10.yaml``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCH_FILE = "jobs/bench/pfl_cifar10.yaml"
PFL_ADDRESSES = "localhost:8000,localhost:8001"
PASS_LIMIT_S = 1800  # a pass whose other rank died would wait on it for ever


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pfl-python", required=True, help="the Python of the environment holding pfl-research"
    )
    parser.add_argument("--sets", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=14, help="rounds a pass, the first one untimed")
    parser.add_argument("overrides", nargs="*", help="key=value for raysim's bench file")
    args = parser.parse_args()
    medians: dict[str, list[float]] = {"pfl": [], "raysim": []}
    for number in range(1, args.sets + 1):
        order = ("pfl", "raysim") if number % 2 else ("raysim", "pfl")
        for side in order:
            run = (
                pfl_pass(args.pfl_python, args.rounds)
                if side == "pfl"
                else raysim_pass(args.rounds, args.overrides)
            )
            medians[side].append(run)
            print(f"set {number} {side}: {run:.3f} s/round (median of {args.rounds - 1} rounds)", flush=True)
    pfl, raysim = statistics.median(medians["pfl"]), statistics.median(medians["raysim"])
    ratios = ", ".join(f"{r / p:.2f}x" for r, p in zip(medians["raysim"], medians["pfl"], strict=True))
    print(f"pfl-research {pfl:.3f} s, raysim {raysim:.3f} s: raysim / pfl-research {raysim / pfl:.2f}x")
    print(f"(ratio of the medians of {args.sets} sets; each set's own ratio: {ratios})")


def pfl_pass(python: str, rounds: int) -> float:
    """One pass of pfl-research in 2 processes (gloo on localhost): rank 0's median s/round."""
    script = [python, str(HERE / "pfl_cifar_shape.py"), "--rounds", str(rounds)]
    env = os.environ | {"PFL_WORKER_ADDRESSES": PFL_ADDRESSES, "OMP_NUM_THREADS": "1"}
    quiet = subprocess.DEVNULL  # rank 0 reports for both
    helper = subprocess.Popen(script, env=env | {"PFL_WORKER_RANK": "1"}, stdout=quiet, stderr=quiet)
    try:
        leader = subprocess.run(
            script, env=env | {"PFL_WORKER_RANK": "0"}, capture_output=True, text=True, timeout=PASS_LIMIT_S
        )
    finally:  # rank 1 ends with rank 0's last round; not if rank 0 failed
        try:
            helper.wait(timeout=60)
        except subprocess.TimeoutExpired:
            helper.kill()
    return median_of(leader, "pfl-research")


def raysim_pass(rounds: int, overrides: list[str]) -> float:
    """One pass of raysim's rounds on the bench file's job: its median s/round."""
    script = [sys.executable, str(HERE / "raysim_rounds.py"), BENCH_FILE, f"engine.num_rounds={rounds}"]
    done = subprocess.run([*script, *overrides], capture_output=True, text=True, timeout=PASS_LIMIT_S)
    return median_of(done, "raysim")


def median_of(done: subprocess.CompletedProcess[str], side: str) -> float:
    """The ``median_s`` of a pass's last ``JSON {...}`` line; the pass's own output where it failed."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("JSON ")]
    if done.returncode != 0 or not lines:
        sys.exit(
            f"the {side} pass failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return float(json.loads(lines[-1][len("JSON ") :])["median_s"])


if __name__ == "__main__":
    main()
