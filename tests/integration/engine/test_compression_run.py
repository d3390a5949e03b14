"""Compressed uploads end to end on the serial backend (tiny digits, an MLP 64-16-10): the bytes
fall by the encoders' ratio while the model still learns, the vectorized trainer encodes alike, and
a resumed run keeps each client's error-feedback residual; a compressed broadcast (the server's
x̂ and residual) resumes bit for bit and still learns, and both directions weigh their messages."""

import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.runtime import worker as raysim_worker
from raysim.runtime.client_state import ClientStateStore

FOUR = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}
# top-k 1% of the MLP's tensors (1024, 16, 160, 10 values): k = ceil(1%) = 11, 1, 2, 1 values of
# float32 and as many indices of 10, 4, 8, 4 bits, bit-packed per tensor
TOPK_BYTES = (44 + 14) + (4 + 1) + (8 + 2) + (4 + 1)
DENSE_BYTES = 4 * (64 * 16 + 16 + 16 * 10 + 10)


def test_top_k_cuts_the_bytes_up_by_its_ratio_and_the_model_still_learns(tmp_path):
    dense = run(tiny_job(), output_dir=tmp_path / "dense")
    sparse = run(
        tiny_job(compression={"upload": {"kind": "topk", "fraction": 0.01}}), output_dir=tmp_path / "k"
    )
    for (_, a), (_, b) in zip(dense.history, sparse.history, strict=True):
        assert a["sys/bytes_up"] == 6 * DENSE_BYTES and b["sys/bytes_up"] == 6 * TOPK_BYTES
    qsgd = run(tiny_job(compression={"upload": {"kind": "qsgd", "bits": 4}}), output_dir=tmp_path / "q")
    first, last = qsgd.history[0][1], qsgd.history[-1][1]
    assert last["eval/clients/accuracy"] > max(0.3, first["eval/clients/accuracy"])  # 10 classes
    assert not torch.equal(qsgd.state.params["1.weight"], dense.state.params["1.weight"])


def test_the_vectorized_trainer_sends_what_the_sequential_one_sends(tmp_path):
    compression = {"upload": {"kind": "sign"}}
    one_by_one = run(tiny_job(compression=compression), output_dir=tmp_path / "a")
    chunked = run(tiny_job(compression=compression, engine={"vectorize": "on"}), output_dir=tmp_path / "b")
    assert [m["sys/bytes_up"] for _, m in one_by_one.history] == [
        m["sys/bytes_up"] for _, m in chunked.history
    ]
    for k, v in one_by_one.state.params.items():
        torch.testing.assert_close(chunked.state.params[k], v, rtol=1e-4, atol=1e-5)


def test_a_resumed_run_keeps_the_clients_residuals(tmp_path):
    def job(rounds):
        return tiny_job(
            dataset=FOUR,
            engine={"num_rounds": rounds, "cohort_size": 4},
            compression={"upload": {"kind": "topk", "fraction": 0.05}},
        )

    whole = run(job(4), output_dir=tmp_path / "whole")
    first = run(job(2), output_dir=tmp_path / "first")
    resumed = run(
        job(4), resume_from=str(first.run_dir / "checkpoints" / "final.pt"), output_dir=tmp_path / "b"
    )
    assert [step for step, _ in resumed.history] == [2, 3]
    for k, v in whole.state.params.items():
        assert torch.equal(v, resumed.state.params[k]), k


# top-k 5% of the MLP's tensors (1024, 16, 160, 10 values): k = ceil(5% of each) = 52, 1, 8, 1 float32
# values and as many indices of 10, 4, 8, 4 bits
TOPK5_BYTES = (208 + 65) + (4 + 1) + (32 + 8) + (4 + 1)


def test_a_resumed_run_continues_the_compressed_broadcast_bit_for_bit(tmp_path):
    """Both directions compressed; the server's x̂ and residual come back from the checkpoint."""

    def job(rounds):
        return tiny_job(
            dataset=FOUR,
            engine={"num_rounds": rounds, "cohort_size": 4},
            compression={
                "upload": {"kind": "topk", "fraction": 0.05},
                "download": {"kind": "topk", "fraction": 0.05},
            },
        )

    whole = run(job(4), output_dir=tmp_path / "whole")
    first = run(job(2), output_dir=tmp_path / "first")
    resumed = run(
        job(4), resume_from=str(first.run_dir / "checkpoints" / "final.pt"), output_dir=tmp_path / "b"
    )
    assert [step for step, _ in resumed.history] == [2, 3]
    for k, v in whole.state.params.items():
        assert torch.equal(v, resumed.state.params[k]), k
    for _, metrics in whole.history:
        assert metrics["sys/bytes_down"] == metrics["sys/bytes_up"] == 4 * TOPK5_BYTES


def test_a_compressed_broadcast_and_compressed_updates_still_learn(tmp_path):
    download = {"kind": "qsgd", "bits": 4, "error_feedback": True}
    compression = {"upload": {"kind": "sign"}, "download": download}
    both = run(tiny_job(compression=compression, engine={"num_rounds": 5}), output_dir=tmp_path / "both")
    first, last = both.history[0][1], both.history[-1][1]
    assert last["eval/clients/accuracy"] > max(0.3, first["eval/clients/accuracy"])  # 10 classes
    # sign: a bit a value and a float32 scale; QSGD 4 bits: 5 bits a value and a float32 norm per
    # bucket of 512 values (two for the 1024-value weight)
    up = (128 + 4) + (2 + 4) + (20 + 4) + (2 + 4)
    down = (640 + 8) + (10 + 4) + (100 + 4) + (7 + 4)
    assert [m["sys/bytes_up"] for _, m in both.history] == [6 * up] * 5
    assert [m["sys/bytes_down"] for _, m in both.history] == [6 * down] * 5


def test_a_diverged_clients_residual_is_never_kept_while_checks_wait(tmp_path, monkeypatch):
    """On a GPU a worker queues its clients' finiteness checks (``device_reads``; forced here on
    the CPU). The error-feedback residual of an update not yet checked must not be kept: clients
    0, 7 and 14 diverge (tests/plugins/algorithms/diverging.py) and leave no state to read later."""
    deferred, real = [], raysim_worker.RoundChecks
    monkeypatch.setattr(raysim_worker, "defers_reads", lambda device: True)
    monkeypatch.setattr(raysim_worker, "RoundChecks", lambda defer: deferred.append(defer) or real(defer))
    job = tiny_job(
        algorithm={"name": "diverging_test", "inner": "fedavg"},
        engine={"num_rounds": 3, "max_failed_clients": 6},
        compression={"upload": {"kind": "topk", "fraction": 0.05}},
    )
    result = run(job, output_dir=tmp_path)
    assert sum(m["sys/nonfinite_clients"] for _, m in result.history) > 0
    assert deferred == [False] * 3  # each client's memory is kept at once: so is its check
    store = ClientStateStore(result.run_dir / "client_state")
    assert [store.get(c, before_round=9) for c in (0, 7, 14)] == [None] * 3
    assert sum(store.get(c, before_round=9) is not None for c in range(20)) > 3  # the others' kept
