"""``engine.asynchrony`` in real runs (serial backend, digits): FedBuff with every client in flight
and a buffer of them all is synchronous FedAvg's round; FedAsync's steps log their staleness, the
simulated clock and a staleness histogram, the same for one seed run twice; a FedBuff run stopped
and resumed ends as the uninterrupted one, bit for bit."""

import json

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.robust.attacks import malicious_clients
from raysim.sampling import CohortSchedule

TARGET = {"metric": "eval/clients/accuracy", "values": [0.01]}  # reached at the first evaluation
DEVICES = {"examples_per_s": 10, "examples_per_s_sigma": 1.0, "bytes_per_s": 4840, "bytes_per_s_sigma": 0}


def test_fedbuff_with_a_buffer_of_every_client_is_a_fedavg_round(tmp_path):
    # transfers take 4 s and training next to nothing: every client reports once before the first
    # one's second report, so the buffer holds each client once, all from the initial model
    fast = DEVICES | {"examples_per_s": 1e6, "examples_per_s_sigma": 0}
    # one batch a client: an asynchronous client draws its shuffle by launch, a round's by the
    # round, and a whole-data batch makes the two orders one update
    system = {"system": {"devices": fast}, "algorithm": {"local": {"batch_size": 4096}}}
    synchronous = run(tiny_job(engine={"num_rounds": 1, "cohort_size": 20}, **system), output_dir=tmp_path)
    fedbuff = {"kind": "fedbuff", "concurrency": 20, "buffer_size": 20}
    buffered = run(tiny_job(engine={"num_rounds": 1, "asynchrony": fedbuff}, **system), output_dir=tmp_path)
    [(_, metrics)] = buffered.history
    assert metrics["async/staleness_max"] == 0 and metrics["sys/aggregated_clients"] == 20
    assert metrics["sys/sim_clock_s"] == synchronous.history[0][1]["sys/sim_clock_s"]  # the slowest report
    for key, value in synchronous.state.params.items():
        assert np.allclose(buffered.state.params[key].numpy(), value.numpy(), atol=1e-6), key


def fedasync_run(tmp_path):
    engine = {"num_rounds": 6, "asynchrony": {"kind": "fedasync", "concurrency": 5}}
    return run(
        tiny_job(
            engine=engine, system={"devices": DEVICES}, evaluation={"every": 3, "time_to_target": TARGET}
        ),
        output_dir=tmp_path,
    )


def test_fedasync_logs_staleness_and_the_clock_and_repeats_for_one_seed(tmp_path):
    first, again = fedasync_run(tmp_path), fedasync_run(tmp_path)
    clocks = [m["sys/sim_clock_s"] for _, m in first.history]
    assert clocks == sorted(clocks) and clocks == [m["sys/sim_clock_s"] for _, m in again.history]
    staleness = [m["async/staleness_max"] for _, m in first.history]
    assert max(staleness) > 0  # five clients in flight: later arrivals started from older models
    mixing = [m["async/mixing"] for _, m in first.history]
    assert np.allclose(mixing, [0.6 * (1 + tau) ** -0.5 for tau in staleness])
    histogram = json.loads((first.run_dir / "staleness.json").read_text())
    assert sum(histogram.values()) == 6
    third = first.history[2][1]  # the first evaluation: the target's time is the async clock's
    assert third["tta/eval/clients/accuracy_0.01/sim_s"] == third["sys/sim_clock_s"]
    for key, value in first.state.params.items():
        assert np.array_equal(again.state.params[key].numpy(), value.numpy()), key


def fedbuff_run(tmp_path, steps, resume_from=None, **sections):
    fedbuff = {"kind": "fedbuff", "concurrency": 5, "buffer_size": 2}
    engine = {"num_rounds": steps, "asynchrony": fedbuff}
    job = tiny_job(engine=engine, system={"devices": DEVICES}, **sections)
    return run(job, output_dir=tmp_path, resume_from=resume_from)


# with top-k's error feedback, each client's residual lives in the client-state snapshot, by launch
UPLOAD = {"compression": {"upload": {"kind": "topk", "fraction": 0.1}}}


@pytest.mark.parametrize("sections", [{}, UPLOAD], ids=["plain", "topk_upload"])
def test_a_resumed_fedbuff_run_ends_as_the_uninterrupted_one_bit_for_bit(tmp_path, sections):
    sections = sections | {"evaluation": {"every": 1, "time_to_target": TARGET}}
    straight = fedbuff_run(tmp_path / "straight", 6, **sections)
    stopped = fedbuff_run(tmp_path / "resumed", 3, **sections)
    final = str(stopped.run_dir / "checkpoints" / "final.pt")
    resumed = fedbuff_run(tmp_path / "resumed", 6, final, **sections)
    assert max(m["async/staleness_max"] for _, m in straight.history) > 0  # clients were in flight
    for key, value in straight.state.params.items():
        assert torch.equal(resumed.state.params[key], value), key
    keys = (
        "sys/sim_clock_s",
        "sys/bytes_up",
        "async/staleness_mean",
        "async/versions_kept",
        "eval/clients/accuracy",
    )
    assert [[m[k] for k in keys] for _, m in resumed.history] == [
        [m[k] for k in keys] for step, m in straight.history if step >= 3
    ]
    arrivals = [CohortSchedule.load(r.run_dir / "cohorts.json", 20) for r in (straight, stopped, resumed)]
    assert arrivals[0].cohorts == arrivals[1].cohorts + arrivals[2].cohorts  # the arrival order
    clients = [c for cohort in arrivals[2].cohorts for c in cohort]
    assert set(clients) & {c for cohort in arrivals[1].cohorts for c in cohort}  # residuals carried over
    tta = "tta/eval/clients/accuracy_0.01/round"  # reached at step 0, before the checkpoint
    assert [step for step, m in straight.history if tta in m] == [0]
    assert not any(tta in m for _, m in resumed.history)  # logged once a run, not again on resuming
    histogram = (straight.run_dir / "staleness.json").read_text()
    assert (resumed.run_dir / "staleness.json").read_text() == histogram  # the whole run's


def test_fedbuffs_median_reads_each_steps_whole_buffer_alie_included(tmp_path):
    fedbuff = {"kind": "fedbuff", "concurrency": 6, "buffer_size": 4}
    attacked = tiny_job(
        engine={"num_rounds": 3, "asynchrony": fedbuff},
        system={"devices": DEVICES},
        robust={"rule": "median"},
        attack={"kind": "alie", "fraction": 0.3},
    )
    result = run(attacked, output_dir=tmp_path)
    cohorts = CohortSchedule.load(result.run_dir / "cohorts.json", 20).cohorts
    malicious = {int(c) for c in malicious_clients(np.arange(20), 0.3, attacked.seed)}
    counts = [sum(c in malicious for c in buffer) for buffer in cohorts]
    assert [m["attack/malicious_in_cohort"] for _, m in result.history] == counts  # the whole buffer's
    assert 0 < sum(counts) < 12 and all(m["sys/aggregated_clients"] == 4 for _, m in result.history)
    assert all(torch.isfinite(v).all() for v in result.state.params.values())
