"""A run's privacy as one value (raysim/privacy/run_privacy.py): a checkpoint's state goes back into
the parts the job has, and one that cannot continue the job is refused with the fix."""

import pytest
import torch

from raysim.aggregate import WeightedMean
from raysim.config.privacy import CentralPrivacy, PrivacyConfig
from raysim.errors import CheckpointError
from raysim.privacy.accounting import SampledGaussian
from raysim.privacy.client_counts import ClientCounts
from raysim.privacy.ledger import LedgerState, PrivacyLedger
from raysim.privacy.run_privacy import RunPrivacy
from raysim.privacy.spending import Spending
from raysim.private_sums import ClientClipping, ClippedSums
from raysim.types import ClientResult, RoundOutput, TrainedClient

LOCAL = PrivacyConfig.model_validate({"local": {"clip_bound": 1.0, "noise_multiplier": 2.0}, "delta": 1e-5})


def ledger() -> PrivacyLedger:
    config = CentralPrivacy(clip_bound=1.0, noise_multiplier=0.0)
    spending = Spending(0.0, 0.0, 0.0, SampledGaussian("poisson", 100, 10, 0.0), 1e-5, "rdp")
    state = LedgerState(0, 1.0, spending.describe(), [])
    return PrivacyLedger(config, spending, denominator=2.0, expected_cohort=2.0, seed=0, salt=0, state=state)


def test_a_release_noises_the_aggregate_and_counts_the_clients_then_resumes():
    privacy = RunPrivacy(ledger(), ClientCounts(LOCAL, plugin="fedavg"))
    clipped = ClippedSums(WeightedMean(), privacy.clipping() or ClientClipping(1.0))
    acc = clipped.add(clipped.zero(), 0, ClientResult({"w": torch.tensor([0.5])}, 1.0, {}))
    output = RoundOutput(aggregate=acc, clients=[TrainedClient(3, 1.0, 0.1)])
    released = privacy.release(WeightedMean(), output, round_num=0)
    assert released.aggregate["w"].item() == pytest.approx(0.5 / 2.0)  # no noise: sum over D = 2
    assert privacy.metrics()["privacy/local/max_reports"] == 1.0 and "privacy/epsilon" in privacy.metrics()
    again = RunPrivacy(ledger(), ClientCounts(LOCAL, plugin="fedavg"))
    again.restore(privacy.state(), "ckpt.pt")
    assert again.ledger is not None and again.ledger.state.num_released == 1
    assert again.clients is not None and again.clients.reports == {3: 1}


@pytest.mark.parametrize(
    "saved, says",
    [
        (None, "without privacy, which a private run cannot continue"),
        ([1, 2], "privacy state is unreadable (a list"),
        ({"central": {}}, "holds no clients privacy state"),
    ],
)
def test_a_state_that_cannot_continue_the_job_is_refused(saved, says):
    with pytest.raises(CheckpointError, match=rf"ckpt.pt: .*{says.replace('(', '[(]')}"):
        RunPrivacy(None, ClientCounts(LOCAL, plugin="fedavg")).restore(saved, "ckpt.pt")
