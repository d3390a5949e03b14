"""tools/robust_cost.py: every rule of the cost table runs on the size asked, FedAvg's mean first."""

import sys
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parents[3] / "tools"
sys.path.insert(0, str(TOOLS))

import robust_cost  # noqa: E402


def test_the_table_has_fedavg_then_every_rule_with_what_it_measured():
    lines = robust_cost.table(12, 100, torch.device("cpu")).splitlines()
    assert lines[0].startswith("n = 12, d = 100 (0 MiB of float32 rows)")
    rows = [line.split(" | ") for line in lines[4:]]
    assert [row[0] for row in rows] == [f"| {name}" for name, _ in robust_cost.rules_for(12)]
    assert "selected 1" in rows[2][4] and "selected 10" in rows[3][4]  # Krum; Multi-Krum's n - f
