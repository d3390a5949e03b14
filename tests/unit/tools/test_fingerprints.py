"""tools/fingerprints.py: a hash that sees one changed bit and no insertion order, metrics kept
only where two runs of the same code agree, every difference between two files named, and two
runs of the same job fingerprinting alike."""

import sys
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parents[3] / "tools"
sys.path.insert(0, str(TOOLS))

import fingerprints  # noqa: E402


def test_the_params_hash_sees_one_bit_and_not_the_order():
    a = {"w": torch.ones(3), "b": torch.zeros(2)}
    assert fingerprints.params_hash(a) == fingerprints.params_hash({"b": torch.zeros(2), "w": torch.ones(3)})
    flipped = torch.ones(3)
    flipped[1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))  # one ulp
    assert fingerprints.params_hash({"w": flipped, "b": torch.zeros(2)}) != fingerprints.params_hash(a)
    assert fingerprints.params_hash({"v": torch.ones(3), "b": torch.zeros(2)}) != fingerprints.params_hash(a)


def test_wall_clock_metrics_are_left_out_and_numbers_rounded():
    kept = fingerprints.stable_metrics(
        {
            "eval/accuracy": 0.123456789012345,
            "sys/time/wall_s": 3.0,
            "sys/worker_utilization": 0.9,
            "sys/client_peak_bytes": 7,
            "sys/bytes_up": 40,
            "train/loss": 1 / 3,
        }
    )
    assert kept == {"eval/accuracy": 0.123456789, "sys/bytes_up": 40.0, "train/loss": 0.3333333333}


def test_every_difference_is_named():
    before = {
        "a": {"params": "x", "history": [[0, {"m": 1.0, "n": 2.0}]]},
        "b": {"error": "ConfigError: no"},
        "c": {"params": "y", "history": []},
    }
    after = {
        "a": {"params": "z", "history": [[0, {"m": 1.0, "o": 3.0}]]},
        "b": {"error": "ConfigError: no"},
        "c": {"error": "ClientError: failed"},
        "d": {"params": "w", "history": []},
    }
    assert fingerprints.differences(before, after) == [
        "a: final params differ",
        "a step 0 n: 2.0 -> None",
        "a step 0 o: None -> 3.0",
        "c: error None -> 'ClientError: failed'",
        "d: not in the first file",
    ]
    assert fingerprints.differences(before, before) == []


def test_two_runs_of_the_same_job_fingerprint_alike(tmp_path):
    first, second = (fingerprints.fingerprint("fedavg", str(tmp_path)) for _ in range(2))
    assert "params" in first and len(first["history"]) >= 2
    assert first == second
