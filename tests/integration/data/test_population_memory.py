"""A million clients prepared and run in a driver that grows by under 96 bytes per client.

The driver's memory is the process's peak resident set, read in a fresh subprocess as ``VmHWM``
(``ru_maxrss`` would start at this test process's size, which Linux carries across exec): first
after a 1,000-client run has paid every lazy import and first allocation, then after a
1,000,000-client run (prepare, three rounds). Before the store's counts were memory-mapped and
prepare wrote its index block by block, the second run rose 121 bytes per client above the
first; now it rises about 72 (a ten-million-client run peaks under 1 GB: docs/performance.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

NUM_CLIENTS = 1_000_000
MAX_BYTES_PER_CLIENT = 96

_CHILD = textwrap.dedent(
    """
    import json, sys
    from raysim.config import JobConfig
    from raysim.engine.loop import run

    def job(num_clients):
        return JobConfig.from_dict({
            "name": f"population-{num_clients}", "seed": 0,
            "dataset": {"name": "synthetic_images", "num_examples": num_clients, "shape": [1, 1, 1],
                        "num_classes": 2, "partition": {"kind": "iid", "num_clients": num_clients},
                        "test_fraction": 0.0, "cache_dir": sys.argv[1]},
            "model": {"name": "mlp", "hidden": [8]},
            "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 1, "lr": 0.1}},
            "engine": {"num_rounds": 3, "cohort_size": 10},
            "evaluation": {"every": 0, "clients": 1},
            "resources": {"backend": "serial"},
            "tracking": {"enabled": False, "progress": False},
        })

    def peak():
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, from this test's process;
        # with the peaks that measuring each client update reset (raysim.runtime.memory)
        from raysim.runtime.memory import peak_rss_bytes
        return peak_rss_bytes()

    run(job(1000), output_dir=sys.argv[2])
    warm = peak()
    run(job(int(sys.argv[3])), output_dir=sys.argv[2])
    print(json.dumps({"warm": warm, "peak": peak()}))
    """
)


def test_a_million_client_run_costs_the_driver_under_96_bytes_per_client(tmp_path):
    command = [
        sys.executable,
        "-c",
        _CHILD,
        str(tmp_path / "cache"),
        str(tmp_path / "runs"),
        str(NUM_CLIENTS),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    memory = json.loads(done.stdout.strip().splitlines()[-1])
    per_client = (memory["peak"] - memory["warm"]) / NUM_CLIENTS
    assert per_client < MAX_BYTES_PER_CLIENT, f"{per_client:.0f} bytes per client"
