"""The GPU check's rows for docs/performance.md: the layout measured and the scale steps' figures."""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[3] / "tools"
sys.path.insert(0, str(TOOLS))

import gpu_check_rows  # noqa: E402

MACHINE = {"card": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "python": "3.12.3"}


def test_the_scale_row_names_the_layout_its_alternatives_and_each_benchs_throughput():
    steps = {
        "bench": {"ok": True, "gpu_workers_per_card": "2", "gpu_layout_1_per_card_clients_per_s": "300.5",
                  "gpu_layout_2_per_card_clients_per_s": "410.0"},
        "bench_cohort1000": {"ok": True, "raysim_clients_per_s": 1234.56, "vectorized_clients_per_s": 2000.0},
        "bench_lm": {"ok": True, "raysim_tokens_per_s": 81216.2, "plain_tokens_per_s": 87286.0},
        "bench_lm_vectorized": {"ok": False, "error": "exit 1"},
        "bench_lm_population": {"ok": True, "raysim_tokens_per_s": 50000.0, "plain_tokens_per_s": 52000.0,
                                "raysim_clients_per_s": 97.66},
    }  # fmt: skip
    row = gpu_check_rows.scale_row({"machine": MACHINE, "steps": steps})
    assert row.split(" | ")[1:] == [
        "NVIDIA H100 80GB HBM3", "2", "1: 300.5, 2: 410.0", "1234.6", "2000.0", "81,216 / 87,286",
        "- / -", "50,000 / 52,000", "97.7 |",
    ]  # fmt: skip
