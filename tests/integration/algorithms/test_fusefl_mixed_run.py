"""Per-client architectures end to end (4 clients of tiny digits, two MLPs by round robin): a
worker holds both, FuseFL fuses them (bytes and size against hand counts), Ray gives the serial
backend's fused model, and what cannot run is refused before any worker starts."""

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.data.prepare import open_dataset
from raysim.engine.build import build
from raysim.engine.loop import run
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.runtime.wire import WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.services import RoundOptions
from raysim.tracking.tracker import MemoryTracker
from raysim.types import RunInfo

FOUR_CLIENTS = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}
ONE_LAYER, TWO_LAYERS = {"name": "mlp", "hidden": [16]}, {"name": "mlp", "hidden": [8, 16]}


def job(algorithm, models=(ONE_LAYER, TWO_LAYERS), **sections):
    return tiny_job(
        algorithm=algorithm, dataset=FOUR_CLIENTS, engine={"cohort_size": 4},
        model_groups={"models": list(models)}, **sections,
    )  # fmt: skip


def test_a_worker_holds_every_architecture_and_gives_each_client_its_own(tmp_path):
    config = job({"name": "fusefl", "splits": ["fc1"]})
    store = open_dataset(config.dataset.name, config.dataset.config)
    trainer = ClientTrainer(WorkerSetup(config.to_dict(), str(store.path), str(tmp_path)))
    assert len(trainer.resident.models) == 2
    widths = [trainer.model_of(c).state_dict()["1.weight"].shape[0] for c in range(4)]
    assert widths == [16, 8, 16, 8]  # round robin: clients 1 and 3 train the two-layer MLP
    seen = {}
    client_update = trainer.algorithm.client_update

    def recording_update(ctx):
        seen[ctx.client_id] = (ctx.model, ctx.model_section["hidden"], P.clone(P.model_params(ctx.model)))
        result = client_update(ctx)
        with torch.no_grad():  # as a plugin training the resident model in place would
            next(ctx.model.parameters()).add_(1.0)
        return result

    trainer.algorithm.client_update = recording_update
    info = RunInfo(4, 4, 3, store.spec, seed=3)
    payload = trainer.algorithm.payload(trainer.algorithm.init({}, info), 0, info)  # stage 0: no parameters
    report = trainer.train(payload, [(0, 0), (1, 1), (2, 2)], 0, RoundOptions())
    assert not report.failures
    assert seen[0][0] is trainer.model_of(0) and seen[0][1] == [16]
    assert seen[1][0] is trainer.model_of(1) and seen[1][1] == [8, 16]
    for name, value in seen[0][2].items():  # client 2 starts where client 0 did: the seeded init
        assert torch.equal(seen[2][2][name], value), name


def test_fusefl_fuses_two_architectures_on_the_serial_backend_and_on_ray(tmp_path, ray_local):
    """Clients 0, 2: 64-16-10; clients 1, 3: 64-8-16-10; cut after fc1. Stage 0 uploads the fc1s
    (2 x 1040 + 2 x 520 values); stage 1 each adapter (48 inputs -> 16 or 8), the fc2 of the
    two-layer towers (8 x 16 + 16) and the heads (16 x 10 + 10). Stage 0 sends nothing: every
    client starts from its own architecture's seeded model."""
    algorithm = {"name": "fusefl", "splits": ["fc1"]}
    serial = run(job(algorithm), output_dir=tmp_path / "s")
    history = dict(serial.history)
    fc1s, adapters, fc2s, head = 2 * 1040 + 2 * 520, 2 * (48 * 16 + 16) + 2 * (48 * 8 + 8), 2 * 144, 170
    assert history[0]["sys/bytes_up"] == fc1s * 4 and history[0]["sys/bytes_down"] == 0
    assert history[1]["sys/bytes_up"] == (adapters + fc2s + 4 * head) * 4
    assert history[2]["fusefl/params"] == fc1s + adapters + fc2s + head
    assert 0.0 < history[2]["eval/clients/accuracy"] <= 1.0
    on_ray = run(job(algorithm, resources={"backend": "ray", "num_workers": 2}), output_dir=tmp_path / "r")
    assert on_ray.final["eval/clients/accuracy"] == pytest.approx(serial.final["eval/clients/accuracy"])
    for k, towers in serial.state.extra.fused.items():
        for m, part in towers.items():
            for name, value in part.items():
                torch.testing.assert_close(on_ray.state.extra.fused[k][m][name], value, atol=1e-5, rtol=0)


def test_architectures_that_cannot_be_fused_are_one_error_before_any_worker(tmp_path):
    """The two-layer towers end 12 wide, the one-layer ones 16: one averaged head cannot read both."""
    narrow_top = {"name": "mlp", "hidden": [8, 12]}
    with pytest.raises(ConfigError) as error:
        build(
            job({"name": "fusefl", "splits": ["fc1"]}, (ONE_LAYER, narrow_top)),
            MemoryTracker(),
            None,
            tmp_path,
        )
    [problem] = error.value.problems
    assert problem.startswith("model_groups: the architectures cannot be fused at algorithm.splits ['fc1']")
    assert "top features ([12, 16] values)" in problem and "split at stage boundaries" in problem
    assert not (tmp_path / "client_state").exists()
    with pytest.raises(ConfigError) as error:
        config = job({"name": "fusefl", "splits": ["fc2"]}, (TWO_LAYERS, ONE_LAYER), model=TWO_LAYERS)
        build(config, MemoryTracker(), None, tmp_path)
    assert error.value.problems == [
        "model_groups.models[1]: algorithm.splits: split point 'fc2': not a block this model can be split "
        "after; choose a block of ['fc1'] or a stage of []"
    ]


def test_a_plain_job_keeps_one_resident_model(tmp_path):
    config = tiny_job()
    store = open_dataset(config.dataset.name, config.dataset.config)
    trainer = ClientTrainer(WorkerSetup(config.to_dict(), str(store.path), str(tmp_path)))
    assert list(trainer.resident.models.values()) == [trainer.model] and trainer.model_of(5) is trainer.model
    assert P.model_params(trainer.model)  # the job's model, as before


def test_the_ensemble_of_two_architectures_is_the_mean_of_each_clients_own_logits(tmp_path):
    """Every client trains its own architecture from that architecture's seeded start; the
    Ensemble's accuracy on the clients' test splits is the hand-made mean of the cached models' logits."""
    cache = tmp_path / "cache"
    local = {"epochs": 1, "batch_size": 16, "lr": 0.1}
    config = job({"name": "ensemble", "cache_dir": str(cache), "local": local})
    result = run(config, output_dir=tmp_path / "e")
    [folder] = cache.iterdir()
    store = open_dataset(config.dataset.name, config.dataset.config)
    tests = [store.client_data(c, "test").arrays for c in range(4)]  # eval/clients pools them
    x = torch.as_tensor(np.concatenate([t["x"] for t in tests])).float()
    y = torch.as_tensor(np.concatenate([t["y"] for t in tests])).long()
    logits = []
    for client, section in enumerate([ONE_LAYER, TWO_LAYERS] * 2):
        model = build_model("mlp", {"hidden": section["hidden"]}, store.spec).eval()
        model.load_state_dict(torch.load(folder / f"client_{client}.pt", weights_only=True)["params"])
        with torch.no_grad():
            logits.append(model(x))
    accuracy = float((torch.stack(logits).mean(dim=0).argmax(dim=1) == y).float().mean())
    assert result.final["eval/clients/accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert result.final["sys/bytes_down"] == 0  # no broadcast: each starts from its own seeded model
