"""The worker's uplink: what it encodes, what it counts, what it keeps beside the plugin's state."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from raysim.compress.codec import ErrorFeedback
from raysim.compress.sparse import TopSparse
from raysim.compress.upload import Uplink
from raysim.config import JobConfig
from raysim.errors import NonFiniteError
from raysim.types import ClientResult


@dataclass(frozen=True)
class WithFisher:
    delta: dict[str, torch.Tensor]
    fisher: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Own:
    c: torch.Tensor


def uplink(where: str, stored: dict) -> Uplink:
    return Uplink(ErrorFeedback(TopSparse(0.25)), where, seed=0, recall=lambda c, r: stored.get(c))


def test_a_field_delta_is_encoded_and_the_other_fields_counted_whole():
    update = WithFisher({"w": torch.tensor([4.0, -1.0, 0.5, 2.0])}, {"w": torch.ones(4)})
    result, sent = uplink("delta", {}).send(ClientResult(update, 1.0, {}), client_id=3, round_num=0)
    assert torch.equal(result.update.delta["w"], torch.tensor([4.0, 0.0, 0.0, 0.0]))
    assert torch.equal(result.update.fisher["w"], torch.ones(4))
    assert sent == (4 + 1) + 16  # one value and one 2-bit index; the Fisher's 4 float32
    assert torch.equal(result.state["codec"]["w"]["residual"], torch.tensor([0.0, -1.0, 0.5, 2.0]))


def test_the_residual_is_read_back_and_the_plugin_state_kept_beside_it():
    stored = {7: {"plugin": {"c": torch.zeros(1)}, "codec": {"w": {"residual": torch.tensor([0.0, 9.0])}}}}
    link = uplink("", stored)
    result, _ = link.send(ClientResult({"w": torch.tensor([1.0, 0.0])}, 1.0, {}, Own(torch.ones(1))), 7, 1)
    assert torch.equal(result.update["w"], torch.tensor([0.0, 9.0]))  # last round's residual sent now
    assert result.state["plugin"] == {"c": torch.ones(1)}
    assert link.plugin_part(stored[7]) == stored[7]["plugin"] and link.plugin_part(None) is None


def test_without_compression_the_update_goes_as_it_is():
    update = {"w": torch.ones(3)}
    result, sent = Uplink().send(ClientResult(update, 1.0, {}), 0, 0)
    assert result.update is update and sent == 12 and Uplink().plugin_part({"x": 1}) == {"x": 1}


def test_a_job_compressing_only_its_download_sends_updates_as_they_are():
    job = JobConfig.from_dict(
        {
            "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
            "model": {"name": "mlp", "hidden": [8]},
            "algorithm": {"name": "fedavg"},
            "compression": {"download": {"kind": "sign"}},
        }
    )
    assert Uplink.of(job, lambda c, r: None).encoder is None  # the client state stays the plugin's


@pytest.mark.parametrize("residual", [[0.0, float("nan")], [0.0, 3e38]])
def test_an_encoded_update_or_residual_that_is_not_finite_is_refused(residual):
    """A finite update with a NaN residual (kept by an older run) or one whose sum with the
    residual overflows float32 (3e38 + 1e38): the server must not sum it, the client not keep it."""
    stored = {7: {"plugin": None, "codec": {"w": {"residual": torch.tensor(residual)}}}}
    update = ClientResult({"w": torch.tensor([1.0, 1e38])}, 1.0, {})
    with pytest.raises(NonFiniteError, match=r"encoded update .* \['(decoded|memory)/w"):
        uplink("", stored).send(update, 7, 1)
