"""FuseFL, one-shot FedAvg and the Ensemble end to end from jobs naming only the algorithm
(serial backend, 4 clients of tiny digits, an MLP): the stages' bytes and the fused model's size
against hand counts, the shared local models trained once, a split point the model lacks refused
before any worker starts."""

import math

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim.engine.build import build
from raysim.engine.loop import run
from raysim.errors import ConfigError
from raysim.tracking.tracker import MemoryTracker

FOUR_CLIENTS = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}


def job(algorithm, **sections):
    return tiny_job(algorithm=algorithm, dataset=FOUR_CLIENTS, engine={"cohort_size": 4}, **sections)


def test_fusefl_runs_its_stages_and_ccvr_from_a_job_naming_only_the_algorithm(tmp_path):
    """MLP 64-16-10 cut after fc1 (the default): stage 0 uploads fc1, stage 1 a linear adapter
    (4 x 16 -> 16) and the head; the fused model is 4 fc1s, 4 adapters and one head."""
    result = run(job({"name": "fusefl"}), output_dir=tmp_path)
    history = dict(result.history)
    fc1, adapter, head = 64 * 16 + 16, 4 * 16 * 16 + 16, 16 * 10 + 10
    assert history[0]["sys/bytes_up"] == 4 * fc1 * 4
    assert history[1]["sys/bytes_up"] == 4 * (adapter + head) * 4
    assert history[1]["sys/bytes_down"] == 4 * 4 * fc1 * 4  # every client gets all 4 fc1s
    final = history[2]
    assert final["fusefl/params"] == 4 * fc1 + 4 * adapter + head
    assert final["fusefl/paper_comm_mib"] == pytest.approx(4 * final["fusefl/mib"])
    assert final["ccvr/bytes_up"] > 0 and math.isfinite(final["ccvr/loss"])
    assert 0.0 < final["eval/clients/accuracy"] <= 1.0
    assert sorted(result.state.extra.fused) == ["0", "1"] and len(result.state.extra.fused["1"]) == 4


def test_a_split_point_the_model_lacks_is_one_error_before_any_worker(tmp_path):
    with pytest.raises(ConfigError) as error:
        build(job({"name": "fusefl", "splits": ["layer2"]}), MemoryTracker(), None, tmp_path)
    message = str(error.value)
    assert "algorithm.splits" in message and "'layer2'" in message and "fc1" in message
    assert not (tmp_path / "client_state").exists()


def test_one_shot_methods_share_one_training_of_the_client_models(tmp_path):
    """oneshot_fedavg trains and caches; the Ensemble then trains nothing and scores the same
    models as an Ensemble that trains them itself; the FedAvg model is their weighted mean."""
    cache = str(tmp_path / "cache")
    local = {"epochs": 1, "batch_size": 16, "lr": 0.1}
    fedavg = run(
        job({"name": "oneshot_fedavg", "cache_dir": cache, "local": local}), output_dir=tmp_path / "a"
    )
    cached = run(job({"name": "ensemble", "cache_dir": cache, "local": local}), output_dir=tmp_path / "b")
    fresh = run(job({"name": "ensemble", "cache_dir": str(tmp_path / "other"), "local": local}),
                output_dir=tmp_path / "c")  # fmt: skip
    assert dict(fedavg.history)[0]["oneshot/trained_clients"] == 4
    assert dict(cached.history)[0]["oneshot/trained_clients"] == 0
    assert dict(fresh.history)[0]["oneshot/trained_clients"] == 4
    assert cached.final["eval/clients/accuracy"] == fresh.final["eval/clients/accuracy"]
    [folder] = (tmp_path / "cache").iterdir()
    saved = [torch.load(folder / f"client_{c}.pt", weights_only=True) for c in range(4)]
    total = sum(s["weight"] for s in saved)
    for name, value in fedavg.state.params.items():
        expected = sum(s["params"][name].double().numpy() * s["weight"] / total for s in saved)
        np.testing.assert_allclose(value.double().numpy(), expected, rtol=1e-6, atol=1e-7)
    changed = run(job({"name": "ensemble", "cache_dir": cache, "local": {**local, "epochs": 2}}),
                  output_dir=tmp_path / "d")  # fmt: skip
    assert dict(changed.history)[0]["oneshot/trained_clients"] == 4  # another local config, another key
