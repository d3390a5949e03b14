"""DP-SGD's accounting through whole runs on real digits: the worst client's epsilon logged each round
is dp-accounting's, computed here from the counts each client reported, and those counts are the
client's data as the round trained on it: all its examples, or ``engine.max_client_examples``.

The reference composes, per client, one ``SelfComposedDpEvent`` of Poisson-sampled Gaussians per
(examples, batch size) it reported, in a ``ComposedDpEvent``, and takes the most epsilon of any."""

import math
from collections import Counter, defaultdict
from dataclasses import replace

import dp_accounting
import pytest

from jobs import tiny_job
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.privacy.client_counts import ClientCounts
from raysim.types import TrainedClient

DELTA, Z, BATCH = 1e-3, 1.0, 16  # tiny_job: 20 clients, batch 16, one epoch


def sample_job(**engine):
    return tiny_job(
        privacy={"sample": {"clip_bound": 1.0, "noise_multiplier": Z}, "delta": DELTA},
        engine={"num_rounds": 2, **engine},
        evaluation={"every": 10},
    )


def recorded(monkeypatch) -> list[list[TrainedClient]]:
    """Each round's trained clients, as the engine hands them to the accountant."""
    rounds: list[list[TrainedClient]] = []
    record = ClientCounts.record

    def spy(self, clients):
        rounds.append(list(clients))
        record(self, clients)

    monkeypatch.setattr(ClientCounts, "record", spy)
    return rounds


def worst_epsilon(rounds: list[list[TrainedClient]]) -> float:
    steps: dict[int, Counter] = defaultdict(Counter)  # client -> (examples, batch) -> noised steps
    for client in (c for clients in rounds for c in clients):
        rate = (
            int(client.metrics["privacy/sample/examples"]),
            int(client.metrics["privacy/sample/batch_size"]),
        )
        steps[client.client_id][rate] += int(client.metrics["privacy/sample/steps"])

    def epsilon(runs: Counter) -> float:
        accountant = dp_accounting.rdp.RdpAccountant()
        sampled = [
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(min(1.0, b / n), dp_accounting.GaussianDpEvent(Z)), k
            )
            for (n, b), k in runs.items()
        ]
        accountant.compose(dp_accounting.ComposedDpEvent(sampled))
        return accountant.get_epsilon(DELTA)

    return max(epsilon(runs) for runs in steps.values())


def stored_examples(job) -> list[int]:
    return open_dataset(job.dataset.name, job.dataset.config).num_examples("train").tolist()


def test_the_logged_epsilon_is_the_worst_clients_from_the_counts_they_reported(tmp_path, monkeypatch):
    rounds = recorded(monkeypatch)
    result = run(sample_job(), output_dir=tmp_path)
    assert len(rounds) == 2 and [step for step, _ in result.history] == [0, 1]
    for step, metrics in result.history:
        expected = worst_epsilon(rounds[: step + 1])
        assert metrics["privacy/sample/epsilon"] == pytest.approx(expected, rel=1e-12)
    sizes = stored_examples(result.job)
    for client in (c for clients in rounds for c in clients):  # one epoch over all its examples
        n = sizes[client.client_id]
        assert client.metrics["privacy/sample/examples"] == n
        assert client.metrics["privacy/sample/batch_size"] == BATCH
        assert client.metrics["privacy/sample/steps"] == math.ceil(n / BATCH)


def test_a_capped_round_is_accounted_at_batch_over_the_capped_examples(tmp_path, monkeypatch):
    cap = 24
    rounds = recorded(monkeypatch)
    result = run(sample_job(max_client_examples=cap), output_dir=tmp_path)
    sizes = stored_examples(result.job)
    clients = [c for r in rounds for c in r]
    assert sum(sizes[c.client_id] > cap for c in clients) >= 3  # most clients hold more than the cap
    for client in clients:
        n = min(cap, sizes[client.client_id])
        assert client.metrics["privacy/sample/examples"] == n
        assert client.metrics["privacy/sample/steps"] == math.ceil(n / BATCH)
    logged = result.final["privacy/sample/epsilon"]
    assert logged == pytest.approx(worst_epsilon(rounds), rel=1e-12)
    # the store's count, at the same steps, would say less: the capped rate 16/24 is the true one
    stored = [
        [replace(c, metrics={**c.metrics, "privacy/sample/examples": float(sizes[c.client_id])}) for c in r]
        for r in rounds
    ]
    assert logged > worst_epsilon(stored) * 1.05
