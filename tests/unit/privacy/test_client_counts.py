"""Each client's spending under local DP and DP-SGD, and the worst client's epsilon
(raysim/privacy/client_counts.py).

The references are dp-accounting's own events, written out here: a client's DP-SGD is one
``SelfComposedDpEvent`` of Poisson-sampled Gaussians per rate it trained at, composed in a
``ComposedDpEvent``; its local DP is the Gaussian mechanism at half the noise multiplier (two
clipped updates are up to 2C apart), once per report."""

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from raysim.config.privacy import PrivacyConfig
from raysim.errors import CheckpointError, ConfigError
from raysim.privacy.client_counts import ClientCounts
from raysim.types import TrainedClient

DELTA = 1e-5
Z = 1.1  # DP-SGD's noise multiplier
SAMPLE = PrivacyConfig.model_validate(
    {
        "sample": {"clip_bound": 1.0, "noise_multiplier": Z},
        "local": {"clip_bound": 1.0, "noise_multiplier": 4.0},
    }
    | {"delta": DELTA}
)


def trained(client_id: int, examples: int, steps: int, batch_size: int = 16) -> TrainedClient:
    """A client as the engine records it: DP-SGD's counts among its metrics, beside the rest."""
    metrics = {
        "train/loss": 0.5,
        "train/steps": 99.0,  # batches: not what is counted
        "privacy/sample/examples": float(examples),
        "privacy/sample/batch_size": float(batch_size),
        "privacy/sample/steps": float(steps),
    }
    return TrainedClient(client_id, weight=float(examples), seconds=0.1, metrics=metrics)


def epsilon(*runs: tuple[int, int, int]) -> float:
    """dp-accounting's epsilon of ``(examples, batch size, steps)`` runs composed."""
    events = [
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(min(1.0, batch / n), dp_accounting.GaussianDpEvent(Z)), steps
        )
        for n, batch, steps in runs
    ]
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return accountant.get_epsilon(DELTA)


def test_a_clients_steps_compose_at_the_rates_it_reported():
    counts = ClientCounts(SAMPLE, plugin="fedavg")
    counts.record([trained(3, examples=200, steps=13)])
    assert counts.metrics()["privacy/sample/epsilon"] == pytest.approx(epsilon((200, 16, 13)), rel=1e-12)
    counts.record([trained(3, examples=200, steps=13)])  # the same rate again: 26 steps at 16/200
    assert counts.metrics()["privacy/sample/epsilon"] == pytest.approx(epsilon((200, 16, 26)), rel=1e-12)
    counts.record([trained(3, examples=50, steps=4)])  # a capped round: 4 steps at 16/50
    expected = epsilon((200, 16, 26), (50, 16, 4))
    assert counts.metrics()["privacy/sample/epsilon"] == pytest.approx(expected, rel=1e-12)
    assert expected > epsilon((200, 16, 30))  # not the store's count: the capped rate costs more


def test_the_worst_client_is_the_one_that_spent_most_not_the_one_with_most_steps():
    """Client 1 takes the most steps, but from many examples (rate 16/1000); client 2 takes fewer
    from few (rate 16/40): its epsilon is the larger, and it is the one logged."""
    counts = ClientCounts(SAMPLE, plugin="fedavg")
    counts.record([trained(1, examples=1000, steps=63), trained(2, examples=40, steps=3)])
    counts.record([trained(1, examples=1000, steps=63), trained(4, examples=500, steps=32)])
    each = {1: epsilon((1000, 16, 126)), 2: epsilon((40, 16, 3)), 4: epsilon((500, 16, 32))}
    assert max(each, key=each.__getitem__) == 2
    assert counts.metrics()["privacy/sample/epsilon"] == pytest.approx(each[2], rel=1e-12)
    assert {c: counts.sample_epsilon(c) for c in each} == pytest.approx(each, rel=1e-12)


def test_local_dp_counts_each_report_and_the_worst_client_is_logged():
    counts = ClientCounts(SAMPLE, plugin="fedavg")
    for cohort in ([1, 2], [2, 3], [2]):
        counts.record([trained(c, examples=100, steps=7) for c in cohort])
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(4.0 / 2), 3))
    metrics = counts.metrics()
    assert metrics["privacy/local/max_reports"] == 3.0
    assert metrics["privacy/local/epsilon"] == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-12)


def test_a_client_that_released_nothing_spends_nothing_and_one_without_counts_is_refused():
    counts = ClientCounts(SAMPLE, plugin="local")
    counts.record([trained(5, examples=0, steps=0)])  # a recall of a kept model
    assert counts.metrics()["privacy/sample/epsilon"] == 0.0 and counts.sample_epsilon(5) == 0.0
    outside = TrainedClient(6, 1.0, 0.1, {"train/loss": 0.5, "train/steps": 3.0})  # its own loop
    with pytest.raises(
        ConfigError, match=r"client 6 of algorithm 'moon' reported no privacy/sample/examples.*outside DP-SGD"
    ):
        ClientCounts(SAMPLE, plugin="moon").record([outside])
    # without privacy.sample nothing is read
    local_only = PrivacyConfig.model_validate(
        {"local": {"clip_bound": 1.0, "noise_multiplier": 4.0}, "delta": DELTA}
    )
    ClientCounts(local_only, plugin="moon").record([outside])


def test_the_state_round_trips_through_a_checkpoint_and_the_run_goes_on_counting(tmp_path):
    counts = ClientCounts(SAMPLE, plugin="fedavg")
    counts.record([trained(1, 200, 13), trained(2, 40, 3)])
    counts.record([trained(1, 50, 4)])
    path = tmp_path / "state.pt"
    torch.save({"clients": counts.state()}, path)
    resumed = ClientCounts(SAMPLE, plugin="fedavg")
    resumed.restore(torch.load(path, weights_only=True)["clients"], str(path))
    assert resumed.metrics() == counts.metrics() and resumed.reports == counts.reports
    assert resumed.sampled == counts.sampled == {1: {(200, 16): 13, (50, 16): 4}, 2: {(40, 16): 3}}
    resumed.record([trained(1, 200, 13)])
    assert resumed.sample_epsilon(1) == pytest.approx(epsilon((200, 16, 26), (50, 16, 4)), rel=1e-12)


@pytest.mark.parametrize(
    "corrupt",
    [
        None,
        "nonsense",
        {"reports": {}, "worst_sample": 0.0},  # a field missing
        {"reports": {}, "steps": {}, "worst_sample": 0.0},  # the earlier layout, without rates
        {"reports": {1: -2}, "sampled": {}, "worst_sample": 0.0},
        {"reports": {}, "sampled": {1: [(200, 16)]}, "worst_sample": 0.0},
        {"reports": {}, "sampled": {1: ((200.5, 16, 3),)}, "worst_sample": 0.0},
        {"reports": {}, "sampled": {}, "worst_sample": "a lot"},
    ],
)
def test_a_corrupt_or_missing_state_is_refused_naming_the_checkpoint_and_the_fix(corrupt):
    counts = ClientCounts(SAMPLE, plugin="fedavg")
    with pytest.raises(
        CheckpointError, match=r"ckpt/final.pt: .*resume from another checkpoint, or drop --resume"
    ):
        counts.restore(corrupt, "ckpt/final.pt")
    assert counts.reports == {} and counts.sampled == {}  # nothing half-restored


def test_a_resume_that_changes_the_client_mechanisms_is_refused():
    counts = ClientCounts(SAMPLE, plugin="fedavg")
    counts.record([trained(1, examples=100, steps=10)])
    other = SAMPLE.model_copy(update={"sample": SAMPLE.sample.model_copy(update={"noise_multiplier": 9.0})})
    with pytest.raises(
        CheckpointError, match="counted under .*noise_multiplier=1.* this job's are .*noise_multiplier=9"
    ):
        ClientCounts(other, plugin="fedavg").restore(counts.state(), "ckpt.pt")
