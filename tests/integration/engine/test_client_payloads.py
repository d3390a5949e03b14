"""A payload part per recipient (``client_payload``): each client receives its own part, only the
worker holding that client receives it, and bytes down count each part once."""

from dataclasses import dataclass

import numpy as np
import torch

from jobs import tiny_job
from raysim import registry
from raysim.aggregate import Sum
from raysim.engine.loop import run
from raysim.runtime.ray_backend import parts_of
from raysim.types import ClientResult, Payload


@dataclass(frozen=True)
class Tag:
    """A client's own part: its id, and as many floats as the id (so the parts differ in size)."""

    client: int
    values: np.ndarray


class TagsBack:
    """FedAvg's server half; each client sends back the id and the sum of its own part."""

    def __init__(self, config):
        self.inner = registry.get("algorithm", "fedavg").factory(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def client_payload(self, state, round_num, client_id, info):
        assert 0 <= client_id < info.num_clients  # the run's facts reach the server half
        return Tag(client_id, np.ones(client_id + 1, np.float32) * (round_num + 1))

    def client_update(self, ctx):
        own = ctx.client_payload
        assert isinstance(own.values, torch.Tensor) and own.values.device == ctx.device  # moved once
        update = {"ids": torch.tensor(float(own.client == ctx.client_id)), "sum": own.values.sum().double()}
        return ClientResult(update, 1.0, {"own/size": float(len(own.values))})

    def aggregator(self):
        return Sum()

    def server_update(self, state, total, round_num, info):
        return state, {"own/matched": float(total["ids"]), "own/sum": float(total["sum"])}


def test_each_client_gets_its_own_part_and_bytes_down_count_each_once(tmp_path):
    registry.register("algorithm", "tags_back_test", config=registry.get("algorithm", "fedavg").config)(
        TagsBack
    )
    job = tiny_job(
        algorithm={"name": "tags_back_test"},
        engine={"num_rounds": 2, "cohort_size": 5},
        resources={"backend": "serial", "num_workers": 2},
    )
    result = run(job, output_dir=tmp_path)
    for round_num, metrics in result.history:
        assert metrics["own/matched"] == 5  # every client saw its own id
        num_values = metrics["sys/bytes_down/per_client"] / 4  # float32: each part counted once
        assert metrics["own/sum"] == num_values * (round_num + 1)  # every value is round_num + 1
        assert (
            metrics["sys/bytes_down"]
            == metrics["sys/bytes_down/params"] + metrics["sys/bytes_down/per_client"]
        )


def test_a_worker_receives_the_parts_of_its_own_clients_only():
    per_client = {3: "a", 7: "b", 9: "c"}
    assert parts_of(per_client, [(0, 7), (2, 3)]) == {7: "b", 3: "a"}
    assert parts_of({}, [(0, 7)]) is None  # the plugin sends none: nothing extra travels


def test_a_plugin_without_client_payload_sends_one_payload():
    from raysim.plugin_defaults import with_client_payloads

    fedavg = registry.get("algorithm", "fedavg")
    payload = Payload({"w": np.zeros(2, np.float32)})
    plugin = fedavg.factory(fedavg.config())
    assert with_client_payloads(plugin, payload, None, 0, [1, 2], None) is payload
