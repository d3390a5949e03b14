"""Every plugin's results, fingerprinted: proof that a restructure changed no number.

Runs each registered algorithm (and, as ``NAME@vec``, each plugin that vectorizes, with
``engine.vectorize: on``) on a tiny digits job with the serial backend and memory tracking, and
writes per run the final global params' hash and every logged metric of every round, less those
that vary between two runs of the same code (wall-clock times, utilization, peak memory). A run
that is refused is recorded by its error, so a refusal that changes counts too. One-shot plugins
get a fresh cache each, so that their clients train.

Usage:
    python tools/fingerprints.py before.json            # at the old commit
    python tools/fingerprints.py after.json fedavg scaffold@vec   # a subset
    python tools/fingerprints.py --compare before.json after.json   # exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

# Metrics that differ between two runs of the same code: wall-clock time and what it drives.
UNSTABLE = ("sys/time", "peak", "_s", "seconds", "per_s", "utilization")
# Plugins the fingerprint also runs vectorized (NAME@vec); the others are refused there, and
# that refusal is part of the fingerprint.
VECTORIZED = (
    "fedavg",
    "fedprox",
    "scaffold",
    "fedgucci",
    "fedgucci_plus",
    "fedsam",
    "moon",
    "feddyn",
    "fedlc",
)
# Options a plugin needs on the tiny job: IMA wraps SCAFFOLD; DENSE and FedBN need BatchNorm
# (and clients large enough that no batch holds one example); DENSE's server work made small.
_BATCHNORM = {"name": "resnet10", "norm": "batch"}
_BIG_CLIENTS = {"dataset": {"partition": {"num_clients": 4, "min_size": 100}}}
OPTIONS: dict[str, dict[str, Any]] = {
    "ima": {"algorithm": {"inner": {"name": "scaffold"}, "average_from": 1, "window": 2}},
    "dense": {
        **_BIG_CLIENTS,
        "model": {**_BATCHNORM, "width": 4},
        "algorithm": {
            "local": {"batch_size": 32},
            "epochs": 2,
            "batch_size": 16,
            "synthesis": {"steps": 2, "batch_size": 16, "latent_dim": 8, "width": 8},
        },
    },
    "fedbn": {
        **_BIG_CLIENTS,
        "model": {**_BATCHNORM, "width": 8},
        "algorithm": {"local": {"batch_size": 32}},
    },
}


def tiny_job(algorithm: str, vectorize: bool) -> dict[str, Any]:
    """The job every fingerprint runs: 12 digits clients, 2 rounds of 4, evaluated each round."""
    from raysim.config import deep_merge

    job = {
        "name": f"fingerprint-{algorithm}",
        "seed": 3,
        "dataset": {
            "name": "digits",
            "partition": {"kind": "dirichlet", "num_clients": 12, "alpha": 0.5, "min_size": 20},
        },
        "algorithm": {"name": algorithm},
        "engine": {"num_rounds": 2, "cohort_size": 4, **({"vectorize": "on"} if vectorize else {})},
        "evaluation": {"every": 1},
        "resources": {"backend": "serial", "num_workers": 1},
        "tracking": {"enabled": False, "progress": False},
    }
    return deep_merge(job, OPTIONS.get(algorithm, {}))


def params_hash(params: Mapping[str, Any]) -> str:
    """A hash of every tensor's name and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(params):
        value = params[name]
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def stable_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics two runs of the same code agree on, numbers rounded to 10 digits."""
    return {
        key: round(float(value), 10) if isinstance(value, (int, float)) else str(value)
        for key, value in metrics.items()
        if not any(part in key for part in UNSTABLE)
    }


def fingerprint(name: str, output_dir: str) -> dict[str, Any]:
    """One run's fingerprint: ``{"params", "history"}``, or ``{"error"}`` when it is refused."""
    from raysim import run
    from raysim.config import JobConfig
    from raysim.errors import RaysimError

    algorithm, _, vectorized = name.partition("@")
    os.environ["RAYSIM_HOME"] = tempfile.mkdtemp(prefix="fingerprint-")  # a fresh one-shot cache
    try:
        result = run(JobConfig.from_dict(tiny_job(algorithm, bool(vectorized))), output_dir=output_dir)
    except RaysimError as refused:
        return {"error": f"{type(refused).__name__}: {refused}"[:400]}
    history = [[step, stable_metrics(metrics)] for step, metrics in result.history]
    return {"params": params_hash(result.state.params), "history": history}


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Every difference between two fingerprint files, over the runs ``after`` holds."""
    found = []
    for name in sorted(after):
        old, new = before.get(name), after[name]
        if old is None:
            found.append(f"{name}: not in the first file")
        elif "error" in old or "error" in new:
            if old.get("error") != new.get("error"):
                found.append(f"{name}: error {old.get('error')!r} -> {new.get('error')!r}")
        else:
            if old["params"] != new["params"]:
                found.append(f"{name}: final params differ")
            rounds_old, rounds_new = dict(map(tuple, old["history"])), dict(map(tuple, new["history"]))
            for step in sorted(set(rounds_old) | set(rounds_new)):
                a, b = rounds_old.get(step, {}), rounds_new.get(step, {})
                found += [
                    f"{name} step {step} {k}: {a.get(k)} -> {b.get(k)}"
                    for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)
                ]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprint files"
    )
    parser.add_argument("output", nargs="?", help="where the fingerprints go (JSON)")
    parser.add_argument("names", nargs="*", help="algorithms to run (NAME@vec vectorized); default all")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(open(path).read()) for path in args.compare)
        found = differences(before, after)
        print("\n".join(found + [f"{len(after)} runs compared, {len(found)} differences"]))
        return 1 if found else 0
    if not args.output:
        parser.error("name an output file, or --compare two")
    from raysim import registry

    names = args.names or registry.names("algorithm") + [f"{name}@vec" for name in VECTORIZED]
    out, runs = tempfile.mkdtemp(prefix="fingerprint-runs-"), {}
    for name in names:
        runs[name] = fingerprint(name, out)
        print(name, runs[name].get("params", runs[name].get("error", "")).split("\n")[0], flush=True)
    with open(args.output, "w") as file:
        json.dump(runs, file, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
