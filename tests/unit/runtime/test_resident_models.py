"""A worker's resident models: one per architecture, built once and kept; each client on its own
architecture's model; its initial weights restored in place where architectures mix."""

import torch

from raysim import params as P
from raysim.config import JobConfig
from raysim.runtime.resident_models import ResidentModels
from raysim.types import DataSpec

SPEC = DataSpec("classification", (1, 8, 8), 10)
ONE_LAYER, TWO_LAYERS = {"name": "mlp", "hidden": [16]}, {"name": "mlp", "hidden": [8, 16]}


def job(**sections):
    base = {
        "seed": 1,
        "dataset": {"name": "digits"},
        "model": ONE_LAYER,
        "algorithm": {"name": "fusefl", "splits": ["fc1"]},
    }
    return JobConfig.from_dict(base | sections)


def test_without_model_groups_every_client_trains_the_one_job_model():
    models = ResidentModels(job(algorithm={"name": "fedavg"}), SPEC, 4, torch.device("cpu"))
    assert not models.mixes and models.of_client(3) is models.model and models.section_of(3)["hidden"] == [16]
    before = P.clone(P.model_params(models.model))
    models.restore_initial(0)  # nothing to restore: the broadcast sets the weights
    assert all(torch.equal(before[k], v) for k, v in P.model_params(models.model).items())


def test_each_client_gets_its_architecture_built_once_and_its_initial_weights_back():
    models = ResidentModels(
        job(model_groups={"models": [ONE_LAYER, TWO_LAYERS]}), SPEC, 4, torch.device("cpu")
    )
    assert models.mixes and len(models.models) == 2
    assert models.of_client(1) is models.of_client(3) is models.for_section(models.section_of(1))  # kept
    assert [models.section_of(c)["hidden"] for c in range(4)] == [[16], [8, 16], [16], [8, 16]]
    model = models.of_client(1)
    initial = P.clone(P.model_params(model))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # a client trained it
    models.restore_initial(3)  # another client of the same architecture starts from the seed's weights
    assert all(torch.equal(initial[k], v) for k, v in P.model_params(model).items())


def test_another_architecture_asked_for_is_built_once_and_kept():
    models = ResidentModels(job(algorithm={"name": "fedavg"}), SPEC, 4, torch.device("cpu"))
    other = models.for_section(TWO_LAYERS)
    assert other is models.for_section(dict(TWO_LAYERS)) and other is not models.model
    assert models.for_section(None) is models.model and not models.mixes  # asked for later: no mixing
