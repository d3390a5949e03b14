"""The GPU check's report as text: its summary and its rows for docs/performance.md's tables of
figures (the steps' results in, lines out).

Usage:
    print(summary(report))   # report: what gpu_check.py writes to gpu_check.json
"""

from __future__ import annotations

import time
from typing import Any


def summary(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"card: {m.get('card')}, torch {m['torch']}, Python {m['python']}, "
        f"{report['carried_mib']} MiB carried"
    ]
    for name, step in report.get("steps", {}).items():
        state = "ok" if step["ok"] else ("skipped" if step.get("skipped") else "FAILED")
        why = step.get("error") or step.get("skipped") or ""
        seconds = f"{step['seconds']} s" if "seconds" in step else ""
        lines.append(f"  {name:12} {state:8} {seconds:>8}  {why}")
    if "error" in report:
        lines.append(report["error"])
    lines.append("PASSED" if report.get("passed") else "NOT PASSED")
    if "steps" in report:
        lines.append(f"rows for docs/performance.md:\n{table_row(report)}\n{scale_row(report)}")
    return "\n".join(lines)


def table_row(report: dict[str, Any]) -> str:
    """The check as a row of docs/performance.md's table of figures."""
    steps, m = report["steps"], report["machine"]
    tests, bench, two = steps["pytest"], steps["bench"], steps["two_workers"]
    vectorized, lm = (
        steps.get("bench_vectorized", {}),
        steps["bench_lm"],
    )  # the layout step's since 2026-12-06
    peaks = two.get("card_processes_peak_mib", {})
    workers = {pid: mib for pid, mib in peaks.items() if pid != str(two.get("driver_pid"))}
    slices = two.get("slices", [])
    cells = [
        time.strftime("%Y-%m-%d"),
        m.get("card") or "none (CPU dry run)",
        m["torch"],
        ", ".join(f"{n} {k}" for k, n in tests.get("tests", {}).items()) or tests.get("skipped", "-"),
        f"{bench['raysim_round_s']:.3f}" if "raysim_round_s" in bench else "-",
        f"{bench['raysim_clients_per_s']:.1f}" if "raysim_clients_per_s" in bench else "-",
        f"{bench['vectorized_vs_plain']:.3f}x" if "vectorized_vs_plain" in bench else "-",
        f"{vectorized['raysim_round_s']:.3f}" if "raysim_round_s" in vectorized else "-",
        f"{lm['throughput_vs_ideal']:.3f}" if "throughput_vs_ideal" in lm else "-",
        str(two.get("clients_per_s", "-")),
        " / ".join(str(mib) for mib in workers.values() if isinstance(mib, int)) or "-",
        ("yes" if two.get("enforced") else "no")
        + "".join(f" (slices of {s['slice_mib']} MiB)" for s in slices[:1] if "slice_mib" in s),
    ]
    return "| " + " | ".join(cells) + " |"


def scale_row(report: dict[str, Any]) -> str:
    """The layout and scale steps as a row of docs/performance.md's second table of figures."""
    steps, m = report["steps"], report["machine"]
    bench, cohort = steps["bench"], steps["bench_cohort1000"]
    lm, batched, population = steps["bench_lm"], steps["bench_lm_vectorized"], steps["bench_lm_population"]
    measured = sorted(
        (int(k.split("_")[2]), v) for k, v in bench.items() if k.endswith("_per_card_clients_per_s")
    )

    def figure(step: dict[str, Any], key: str, form: str) -> str:
        return format(step[key], form) if key in step else "-"

    def tokens(step: dict[str, Any]) -> str:
        return f"{figure(step, 'raysim_tokens_per_s', ',.0f')} / {figure(step, 'plain_tokens_per_s', ',.0f')}"

    cells = [
        time.strftime("%Y-%m-%d"),
        m.get("card") or "none (CPU dry run)",
        str(bench.get("gpu_workers_per_card", "-")),
        ", ".join(f"{n}: {v}" for n, v in measured) or "-",
        figure(cohort, "raysim_clients_per_s", ".1f"),
        figure(cohort, "vectorized_clients_per_s", ".1f"),
        *(tokens(step) for step in (lm, batched, population)),
        figure(population, "raysim_clients_per_s", ".1f"),
    ]
    return "| " + " | ".join(cells) + " |"
